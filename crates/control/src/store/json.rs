//! Rule documents as JSON: the document the history records, RFC 7396 merge patches, and
//! reading a document with the field at fault named.

use serde_json::{Map, Value};

use tollgate_node::rules::native::{FieldError, RuleDoc};

/// The rule document as JSON (what history records).
pub fn doc_json(doc: &RuleDoc) -> Value {
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

/// RFC 7396: objects merge recursively, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in fields {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Reads a JSON document into `T`, naming the field at fault: the path to a value of the
/// wrong type, or the field an error message names (unknown, missing), else `body`.
pub fn from_json<'de, T: serde::Deserialize<'de>>(
    document: impl serde::Deserializer<'de, Error = serde_json::Error>,
) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(document).map_err(|e| {
        let path = e.path().to_string();
        let mut error = serde_field_error(&e.into_inner().to_string());
        // `?` marks a place the parser never reached (a syntax error before any key).
        if error.field == "body" && !path.is_empty() && path != "." && !path.contains('?') {
            error.field = path;
        }
        error
    })
}

/// A serde error message as a field error: `unknown field `x`` names `x`.
pub fn serde_field_error(message: &str) -> FieldError {
    let field = message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field"))
        .map(str::to_owned)
        .unwrap_or_else(|| "body".into());
    FieldError {
        field,
        reason: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut doc = json!({"mode": "ENFORCE", "match": {"a": "1", "b": "2"}, "capacity": 5});
        merge_patch(
            &mut doc,
            &json!({"mode": "DISABLED", "match": {"b": null, "c": "3"}}),
        );
        assert_eq!(
            doc,
            json!({"mode": "DISABLED", "match": {"a": "1", "c": "3"}, "capacity": 5})
        );
    }

    #[test]
    fn serde_errors_name_their_field() {
        assert_eq!(
            serde_field_error("unknown field `capacty`, expected one of ...").field,
            "capacty"
        );
        assert_eq!(
            serde_field_error("missing field `algorithm`").field,
            "algorithm"
        );
        assert_eq!(
            serde_field_error("EOF while parsing a value at line 1 column 3").field,
            "body"
        );
    }
}
