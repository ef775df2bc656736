//! Input schemas: generated from Rust types for `#[tool]`, and checked against
//! arguments before any tool body runs.

use schemars::JsonSchema;
use serde_json::Value;

/// The JSON schema of `T` in the form every client accepts: draft 2020-12 with
/// subschemas inlined (no `$ref`), only standard formats, no `$schema` or `title`.
pub fn schema_for<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .with_transform(schemars::transform::RestrictFormats::default())
        .into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = schema.to_value();
    normalize_object_schema(&mut value);
    value
}

/// Drops keys clients reject and makes sure an object schema lists `properties`.
pub fn normalize_object_schema(value: &mut Value) {
    if let Some(object) = value.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        if object.get("type").and_then(Value::as_str) == Some("object")
            && !object.contains_key("properties")
        {
            object.insert("properties".into(), Value::Object(Default::default()));
        }
    }
}

/// A compiled input schema.
pub struct ArgsValidator {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for ArgsValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArgsValidator")
    }
}

/// One reason arguments do not fit the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgsViolation {
    /// Dotted path of the field (`filters.limit`), or `None` for the arguments object.
    pub field: Option<String>,
    pub message: String,
}

impl ArgsValidator {
    pub fn new(schema: &Value) -> Result<ArgsValidator, String> {
        jsonschema::options()
            .should_validate_formats(false)
            .build(schema)
            .map(|validator| ArgsValidator { validator })
            .map_err(|e| e.to_string())
    }

    /// The first violation, with the offending field named. A missing required
    /// property is reported at that property, not at its parent.
    pub fn check(&self, args: &Value) -> Result<(), ArgsViolation> {
        let Some(error) = self.validator.iter_errors(args).next() else {
            return Ok(());
        };
        let mut path: Vec<String> = error
            .instance_path()
            .into_iter()
            .map(|segment| match segment {
                jsonschema::paths::LocationSegment::Property(p) => p.to_string(),
                jsonschema::paths::LocationSegment::Index(i) => i.to_string(),
            })
            .collect();
        if let jsonschema::error::ValidationErrorKind::Required { property } = error.kind()
            && let Some(name) = property.as_str()
        {
            path.push(name.to_owned());
        }
        if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
            error.kind()
            && let Some(name) = unexpected.first()
        {
            path.push(name.clone());
        }
        Err(ArgsViolation {
            field: if path.is_empty() {
                None
            } else {
                Some(path.join("."))
            },
            message: error.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_required_field_is_named() {
        let schema =
            json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]});
        let validator = ArgsValidator::new(&schema).expect("valid schema");
        let violation = validator.check(&json!({})).expect_err("must fail");
        assert_eq!(violation.field.as_deref(), Some("city"));
    }

    #[test]
    fn wrong_type_names_nested_field() {
        let schema = json!({"type":"object","properties":{"filter":{"type":"object","properties":{"limit":{"type":"integer"}}}}});
        let validator = ArgsValidator::new(&schema).expect("valid schema");
        let violation = validator
            .check(&json!({"filter": {"limit": "ten"}}))
            .expect_err("must fail");
        assert_eq!(violation.field.as_deref(), Some("filter.limit"));
        assert!(validator.check(&json!({"filter": {"limit": 10}})).is_ok());
    }
}
