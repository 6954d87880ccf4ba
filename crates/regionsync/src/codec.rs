//! The one place that knows the wire format of region-link messages: bincode 2 (standard
//! configuration: little-endian, variable-length integers), with a size limit the decoder
//! enforces before it allocates. Everything else sees typed messages.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest encoded message, either way.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_MESSAGE_BYTES>()
}

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Not a message of the expected type (truncated, corrupted, or another type).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Bytes left over after the message.
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
    /// Larger than [`MAX_MESSAGE_BYTES`].
    #[error("message of {0} bytes; at most {MAX_MESSAGE_BYTES} are accepted")]
    TooLarge(usize),
}

/// Encodes a message.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, CodecError> {
    let bytes = bincode::serde::encode_to_vec(message, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    Ok(bytes)
}

/// Decodes a whole message: every byte must belong to it.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    let (message, read) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if read != bytes.len() {
        return Err(CodecError::Trailing(bytes.len() - read));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{Batch, Entry, Origin};

    fn batch() -> Batch {
        Batch {
            origin: Origin {
                region: "us".into(),
                incarnation: 7,
            },
            seq: 3,
            sent_at: 1_700_000_000_000_000,
            entries: vec![Entry {
                rule: "per-key".into(),
                identity: b"k_123".to_vec(),
                until: 1_700_000_060_000_000,
                total: 42,
                at: 1_700_000_000_500_000,
            }],
        }
    }

    #[test]
    fn messages_round_trip_and_damage_is_refused() {
        let bytes = encode(&batch()).expect("encodes");
        assert_eq!(decode::<Batch>(&bytes).expect("decodes"), batch());
        assert!(matches!(
            decode::<Batch>(&bytes[..bytes.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode::<Batch>(&longer), Err(CodecError::Trailing(1)));
        // A length prefix claiming a huge vector must fail on the limit, not allocate.
        let mut huge = encode(&Origin {
            region: "us".into(),
            incarnation: 1,
        })
        .expect("encodes");
        huge.extend_from_slice(&[0x03, 0xfc, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode::<Batch>(&huge).is_err());
    }
}
