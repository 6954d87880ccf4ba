//! Compiles the protos with protox (pure Rust), so no system `protoc` is needed.
//!
//! Two `string` fields of Envoy's are generated as bytes ([`CLIENT_TEXT`]): their values are
//! copied from a client's request by Envoy, which does not check that they are UTF-8, and a
//! `string` that is not would fail the whole message's decoding: an RPC error, which Envoy's
//! default `failure_mode_deny: false` turns into an uncounted allow. The wire format of both
//! is the same; reflection (`descriptors.bin`) still shows Envoy's own `string`.

use prost::Message;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};

/// `(file, message path, field)`: fields a client's bytes reach through Envoy.
const CLIENT_TEXT: &[(&str, &[&str], &str)] = &[
    // A rate limit descriptor entry's value (a header's, a path's).
    (
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        &["RateLimitDescriptor", "Entry"],
        "value",
    ),
    // An RLQS bucket id's values (`map<string, string>`: the map's entry message).
    (
        "envoy/service/rate_limit_quota/v3/rlqs.proto",
        &["BucketId", "BucketEntry"],
        "value",
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/service/ratelimit/v3/rls.proto",
        "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
        "proto/tollgate/ratelimit/v1/ratelimit.proto",
        "proto/tollgate/regionsync/v1/regionsync.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), fds.encode_to_vec())?;
    let mut generated = fds.clone();
    for (file, path, field) in CLIENT_TEXT {
        read_as_bytes(&mut generated, file, path, field)?;
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(generated)?;
    Ok(())
}

/// Makes `field` of the message at `path` in `file` a `bytes` field.
fn read_as_bytes(
    fds: &mut FileDescriptorSet,
    file: &str,
    path: &[&str],
    field: &str,
) -> Result<(), String> {
    let missing = || format!("{file}: no {}.{field} to read as bytes", path.join("."));
    let proto = fds
        .file
        .iter_mut()
        .find(|f| f.name() == file)
        .ok_or_else(missing)?;
    let (first, rest) = path.split_first().ok_or_else(missing)?;
    let mut message: &mut DescriptorProto = proto
        .message_type
        .iter_mut()
        .find(|m| m.name() == *first)
        .ok_or_else(missing)?;
    for name in rest {
        message = message
            .nested_type
            .iter_mut()
            .find(|m| m.name() == *name)
            .ok_or_else(missing)?;
    }
    let f = message
        .field
        .iter_mut()
        .find(|f| f.name() == field && f.r#type() == Type::String)
        .ok_or_else(missing)?;
    f.set_type(Type::Bytes);
    Ok(())
}
