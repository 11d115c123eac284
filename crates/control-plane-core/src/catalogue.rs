//! The event-type catalogue (ADR 0025): the types an account registers, each
//! with a description, an optional JSON Schema and an optional example.
//!
//! A publish of a registered type with a schema is checked against it in
//! the publish's transaction ([`CompiledSchema::check`]): a payload that does not
//! match fails the publish (or its whole batch) with `InvalidInput` naming
//! the failing path, and nothing is stored. A type that is not registered,
//! or registered without a schema, publishes as before.
//!
//! The adapters keep compiled schemas in a cache of their own
//! (`control_plane_store_kit::schemas`), so a publish costs one lookup and
//! one validation.

use serde_json::Value;

use crate::{validate_free_text, validate_short_text, AccountId, AlertKind, StoreError, Timestamp};

/// The largest schema, as compact JSON text.
pub const MAX_SCHEMA_BYTES: usize = 65_536;
/// The largest example, as compact JSON text.
pub const MAX_EXAMPLE_BYTES: usize = 65_536;
/// The longest description.
pub const MAX_DESCRIPTION_BYTES: usize = 1_024;
/// The most regular expressions one schema may hold (`pattern` values and
/// `patternProperties` keys): each compiles to a program of up to
/// 64 KiB and a lazy DFA of as much, so this bounds what one
/// registration can make the process keep (issue 54: 1,829 patterns took
/// 190 MiB).
pub const MAX_SCHEMA_PATTERNS: usize = 32;
/// The largest compiled form of one `pattern`, in bytes, and of its lazy
/// DFA: patterns run on the `regex` engine (linear time, no backtracking).
const PATTERN_BYTES: usize = 64 * 1024;
/// The longest 422 message about a payload: the failing value and its path
/// are quoted in it, and a long message is cut.
const MAX_MESSAGE_BYTES: usize = 400;
/// What a schema's remote `$ref` is answered with: nothing is fetched.
pub const REMOTE_REFUSED: &str = "remote references are not fetched";

/// A registered event type.
#[derive(Clone, Debug, PartialEq)]
pub struct EventType {
    /// Owning account.
    pub account: AccountId,
    /// The type's name, as events are published with it.
    pub name: String,
    /// What the type means, for the people who subscribe to it.
    pub description: String,
    /// The JSON Schema its payloads must match, if any.
    pub schema: Option<Value>,
    /// An example payload (it matches `schema`), sent by "send example".
    pub example: Option<Value>,
    /// When it was first registered.
    pub created_at: Timestamp,
    /// When it was last registered again (replaced).
    pub updated_at: Timestamp,
}

impl EventType {
    /// The publish that "send example" makes: this type with its example.
    ///
    /// # Errors
    /// `InvalidInput` when the type has no example.
    pub fn example_request(self) -> Result<crate::Checked<crate::PublishRequest>, StoreError> {
        let Some(example) = self.example else {
            return Err(StoreError::InvalidInput(format!(
                "event type {:?} has no example to send",
                self.name
            )));
        };
        crate::Check::checked(crate::PublishRequest::new(self.account, self.name, example))
    }
}

/// Registers an event type, or replaces what an earlier registration said.
#[derive(Clone, Debug, PartialEq)]
pub struct EventTypePut {
    /// Owning account.
    pub account: AccountId,
    /// The type's name (see [`validate_type_name`]).
    pub name: String,
    /// At most [`MAX_DESCRIPTION_BYTES`], no NUL.
    pub description: String,
    /// A JSON Schema (draft 2020-12 unless its `$schema` says another draft),
    /// at most [`MAX_SCHEMA_BYTES`]; only local `$ref`s resolve.
    pub schema: Option<Value>,
    /// An example payload, at most [`MAX_EXAMPLE_BYTES`]; it must match `schema`.
    pub example: Option<Value>,
}

impl EventTypePut {
    /// A type with a description and neither schema nor example.
    pub fn new(
        account: AccountId,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        EventTypePut {
            account,
            name: name.into(),
            description: description.into(),
            schema: None,
            example: None,
        }
    }

    /// The schema as the compact JSON text that is stored and cached.
    ///
    /// # Errors
    /// `InvalidInput` when it is larger than [`MAX_SCHEMA_BYTES`].
    pub fn schema_text(&self) -> Result<Option<String>, StoreError> {
        let Some(schema) = &self.schema else {
            return Ok(None);
        };
        let text = schema.to_string();
        if text.len() > MAX_SCHEMA_BYTES {
            return Err(StoreError::InvalidInput(format!(
                "schema must be at most {MAX_SCHEMA_BYTES} bytes of JSON, got {}",
                text.len()
            )));
        }
        Ok(Some(text))
    }

    /// The example as stored.
    pub fn example_text(&self) -> Option<String> {
        self.example.as_ref().map(Value::to_string)
    }

    /// The registered type, as first stored at `at`.
    pub fn event_type_at(&self, created_at: Timestamp, at: Timestamp) -> EventType {
        EventType {
            account: self.account.clone(),
            name: self.name.clone(),
            description: self.description.clone(),
            schema: self.schema.clone(),
            example: self.example.clone(),
            created_at,
            updated_at: at,
        }
    }
}

impl crate::Check for EventTypePut {
    /// Checks every field; the schema must compile and the example match it.
    ///
    /// # Errors
    /// `InvalidInput` naming the field (and, for the example, the path).
    fn check(&self) -> Result<(), StoreError> {
        validate_type_name(&self.name)?;
        validate_free_text("description", &self.description)?;
        if self.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(StoreError::InvalidInput(format!(
                "description must be at most {MAX_DESCRIPTION_BYTES} bytes, got {}",
                self.description.len()
            )));
        }
        let schema = self
            .schema_text()?
            .map(|t| compile_schema(&t))
            .transpose()?;
        if let Some(example) = &self.example {
            let len = example.to_string().len();
            if len > MAX_EXAMPLE_BYTES {
                return Err(StoreError::InvalidInput(format!(
                    "example must be at most {MAX_EXAMPLE_BYTES} bytes of JSON, got {len}"
                )));
            }
            if let Some(schema) = &schema {
                schema.check(&self.name, example).map_err(|e| match e {
                    StoreError::InvalidInput(m) => {
                        StoreError::InvalidInput(format!("example: {m}"))
                    }
                    other => other,
                })?;
            }
        }
        Ok(())
    }
}

/// Checks the name of a published or registered event type: 1 to 255
/// characters, no control characters, no `*` (which only subscriptions use,
/// as `*` or a final `.*`), and not the type of an operational event.
///
/// # Errors
/// `InvalidInput` saying which rule the name breaks.
pub fn validate_type_name(name: &str) -> Result<(), StoreError> {
    validate_short_text("event type", name)?;
    if name == "." || name == ".." {
        return Err(StoreError::InvalidInput(format!(
            "event type {name:?} is not a name: it cannot be addressed in a URL path"
        )));
    }
    if name.contains('*') {
        return Err(StoreError::InvalidInput(format!(
            "event type {name:?} must not contain '*': only subscriptions use wildcards"
        )));
    }
    if AlertKind::from_event_type(name).is_some() {
        return Err(StoreError::InvalidInput(format!(
            "event type {name:?} is reserved for operational events"
        )));
    }
    Ok(())
}

/// Whether a subscription (an endpoint's `event_types` entry) takes events
/// of `event_type`: the same name, `*` for every type, or `prefix.*` for
/// every type that starts with `prefix.` (at any depth).
pub fn subscription_matches(subscription: &str, event_type: &str) -> bool {
    match subscription.strip_suffix('*') {
        None => subscription == event_type,
        Some("") => true,
        Some(prefix) => prefix.ends_with('.') && event_type.starts_with(prefix),
    }
}

/// Checks a subscription: a type name, `*`, or `prefix.*`.
///
/// # Errors
/// `InvalidInput` for a `*` anywhere else.
pub fn validate_subscription(subscription: &str) -> Result<(), StoreError> {
    validate_short_text("event type", subscription)?;
    let rest = match subscription.strip_suffix('*') {
        None => subscription,
        Some("") => return Ok(()),
        Some(prefix) if prefix.ends_with('.') => prefix,
        Some(_) => "*",
    };
    if rest.contains('*') {
        return Err(StoreError::InvalidInput(format!(
            "event type {subscription:?} may use '*' only alone or as its last segment (\"order.*\")"
        )));
    }
    Ok(())
}

/// A schema compiled under the limits above.
pub struct CompiledSchema {
    validator: jsonschema::Validator,
    cost: usize,
}

impl CompiledSchema {
    /// Checks `payload` against it, as the schema of `event_type`.
    ///
    /// # Errors
    /// `InvalidInput` naming the type, the path of the first failing value
    /// and why.
    pub fn check(&self, event_type: &str, payload: &Value) -> Result<(), StoreError> {
        let Err(e) = self.validator.validate(payload) else {
            return Ok(());
        };
        let path = e.instance_path().to_string();
        let at = if path.is_empty() {
            "/".to_string()
        } else {
            path
        };
        // The failing value and its path come from the payload: a large
        // one is cut, so the answer stays short.
        let mut message =
            format!("payload does not match the schema of event type {event_type:?} at {at}: {e}");
        if message.len() > MAX_MESSAGE_BYTES {
            let mut cut = MAX_MESSAGE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("...");
        }
        Err(StoreError::InvalidInput(message))
    }

    /// An upper bound of the bytes its compiled form keeps in memory: its
    /// patterns at their limits, and the validator's tree at a generous 32
    /// bytes per byte of the schema's text.
    pub fn cost(&self) -> usize {
        self.cost
    }
}

/// How many regular expressions `schema` holds: `pattern` strings and the
/// keys of `patternProperties`, at any depth.
fn patterns_in(schema: &Value) -> usize {
    match schema {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                let here = match (k.as_str(), v) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(props)) => props.len(),
                    _ => 0,
                };
                here + patterns_in(v)
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns_in).sum(),
        _ => 0,
    }
}

/// Answers every remote `$ref` with [`REMOTE_REFUSED`]: a schema never makes
/// the service fetch a URL (the crate's HTTP features are off as well).
struct RefuseRemote;

impl jsonschema::Retrieve for RefuseRemote {
    fn retrieve(
        &self,
        _uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(REMOTE_REFUSED.into())
    }
}

/// Compiles the schema `text`. A schema with more than
/// [`MAX_SCHEMA_PATTERNS`] regular expressions is refused before anything
/// is compiled.
///
/// # Errors
/// `InvalidInput` when it is not JSON, holds too many patterns or does
/// not compile (a remote `$ref` does not: [`REMOTE_REFUSED`]).
pub fn compile_schema(text: &str) -> Result<CompiledSchema, StoreError> {
    let schema: Value = serde_json::from_str(text)
        .map_err(|e| StoreError::InvalidInput(format!("schema is not JSON: {e}")))?;
    let patterns = patterns_in(&schema);
    if patterns > MAX_SCHEMA_PATTERNS {
        return Err(StoreError::InvalidInput(format!(
            "schema holds {patterns} regular expressions (pattern, patternProperties); \
             at most {MAX_SCHEMA_PATTERNS} are accepted"
        )));
    }
    let validator = jsonschema::options()
        .with_retriever(RefuseRemote)
        .with_pattern_options(
            jsonschema::PatternOptions::regex()
                .size_limit(PATTERN_BYTES)
                .dfa_size_limit(PATTERN_BYTES),
        )
        .build(&schema)
        .map_err(|e| StoreError::InvalidInput(format!("schema does not compile: {e}")))?;
    Ok(CompiledSchema {
        validator,
        cost: text.len() * 32 + patterns * 2 * PATTERN_BYTES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Check;
    use serde_json::json;

    fn put(schema: Option<Value>, example: Option<Value>) -> EventTypePut {
        EventTypePut {
            schema,
            example,
            ..EventTypePut::new(AccountId::new("a").unwrap(), "order.created", "An order")
        }
    }

    fn order_schema() -> Value {
        json!({
            "type": "object",
            "required": ["id", "items"],
            "properties": {
                "id": {"type": "string"},
                "items": {"type": "array", "items": {
                    "type": "object",
                    "required": ["sku"],
                    "properties": {"sku": {"type": "string"}}
                }}
            }
        })
    }

    #[test]
    fn a_payload_is_checked_and_the_failing_path_named() {
        let schema = compile_schema(&order_schema().to_string()).unwrap();
        let check_payload = |t: &str, s: &CompiledSchema, p: &Value| s.check(t, p);
        check_payload("order.created", &schema, &json!({"id": "o1", "items": []})).unwrap();
        let err = check_payload(
            "order.created",
            &schema,
            &json!({"id": "o1", "items": [{"sku": "a"}, {"sku": 5}]}),
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::InvalidInput(_)));
        assert!(err.to_string().contains("at /items/1/sku"), "{err}");
        assert!(err.to_string().contains("order.created"), "{err}");
        let root = check_payload("order.created", &schema, &json!([1])).unwrap_err();
        assert!(root.to_string().contains("at /:"), "{root}");
        // A large failing value is not quoted whole.
        let big = json!(["x".repeat(10_000)]);
        let cut = check_payload("order.created", &schema, &big).unwrap_err();
        assert!(cut.to_string().len() < MAX_MESSAGE_BYTES + 200, "{cut}");
        // So is a long path (a key of the payload).
        let strings =
            compile_schema(&json!({"additionalProperties": {"type": "string"}}).to_string())
                .unwrap();
        let mut long_key = serde_json::Map::new();
        long_key.insert("k".repeat(10_000), json!(1));
        let cut = check_payload("t", &strings, &Value::Object(long_key)).unwrap_err();
        assert!(cut.to_string().len() < MAX_MESSAGE_BYTES + 200, "{cut}");
        assert!(cut.to_string().ends_with("..."), "{cut}");
    }

    #[test]
    fn a_pattern_whose_compiled_form_is_over_its_limit_is_refused() {
        // One pattern, well under the count of patterns, whose compiled
        // form is over 64 KiB: the regex crate's own limit (10 MiB) takes it.
        let heavy = json!({"type": "string", "pattern": "[^x]{5000}"});
        let unlimited = jsonschema::options()
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&heavy);
        assert!(unlimited.is_ok(), "only our limit refuses it");
        let err = put(Some(heavy), None).check().unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidInput(m) if m.contains("does not compile")),
            "{err:?}"
        );
        let light = json!({"type": "string", "pattern": "[^x]{30}"});
        put(Some(light), None).check().unwrap();
    }

    #[test]
    fn a_schema_with_too_many_patterns_is_refused_before_it_compiles() {
        let props: serde_json::Map<String, Value> = (0..=MAX_SCHEMA_PATTERNS)
            .map(|i| {
                (
                    format!("f{i}"),
                    json!({"type": "string", "pattern": format!("^[ab]{{0,900}}c{i}$")}),
                )
            })
            .collect();
        let many = json!({"type": "object", "properties": props});
        assert_eq!(patterns_in(&many), MAX_SCHEMA_PATTERNS + 1);
        let err = put(Some(many), None).check().unwrap_err();
        assert!(err.to_string().contains("regular expressions"), "{err}");
        let keys = json!({"patternProperties": {"^a": {}, "^b": {"pattern": "x"}}});
        assert_eq!(patterns_in(&keys), 3);
        let fewer: serde_json::Map<String, Value> = (0..MAX_SCHEMA_PATTERNS)
            .map(|i| {
                (
                    format!("f{i}"),
                    json!({"type": "string", "pattern": format!("^[ab]{{0,90}}c{i}$")}),
                )
            })
            .collect();
        put(Some(json!({"type": "object", "properties": fewer})), None)
            .check()
            .unwrap();
    }

    #[test]
    fn a_registration_needs_a_compiling_schema_and_a_matching_example() {
        put(Some(order_schema()), Some(json!({"id": "o1", "items": []})))
            .check()
            .unwrap();
        put(None, Some(json!("anything"))).check().unwrap();
        let bad_example = put(Some(order_schema()), Some(json!({"id": 1, "items": []})))
            .check()
            .unwrap_err();
        assert!(
            bad_example
                .to_string()
                .starts_with("invalid input: example: "),
            "{bad_example}"
        );
        assert!(bad_example.to_string().contains("at /id"), "{bad_example}");
        let bad_schema = put(Some(json!({"type": "no-such-type"})), None)
            .check()
            .unwrap_err();
        assert!(
            bad_schema.to_string().contains("schema does not compile"),
            "{bad_schema}"
        );
        let remote = put(Some(json!({"$ref": "https://example.com/s.json"})), None)
            .check()
            .unwrap_err();
        assert!(remote.to_string().contains(REMOTE_REFUSED), "{remote}");
        // Patterns run on a linear-time engine, which has no look-around:
        // a schema that needs a backtracking engine does not compile.
        let lookahead = put(Some(json!({"type": "string", "pattern": "(?=a)"})), None)
            .check()
            .unwrap_err();
        assert!(
            lookahead.to_string().contains("schema does not compile"),
            "{lookahead}"
        );
        let huge = put(
            Some(json!({"description": "x".repeat(MAX_SCHEMA_BYTES)})),
            None,
        )
        .check()
        .unwrap_err();
        assert!(
            huge.to_string().contains("schema must be at most"),
            "{huge}"
        );
        let mut long = put(None, None);
        long.description = "d".repeat(MAX_DESCRIPTION_BYTES + 1);
        assert!(long.check().is_err());
    }

    #[test]
    fn names_and_subscriptions_keep_wildcards_apart() {
        validate_type_name("order.created").unwrap();
        for bad in ["", "order.*", "*", "endpoint.disabled", ".", ".."] {
            assert!(validate_type_name(bad).is_err(), "{bad:?}");
        }
        for ok in ["order.created", "*", "order.*", "a.b.*"] {
            validate_subscription(ok).unwrap();
        }
        for bad in ["order*", "*.created", "or*der.*", "**", ".*x"] {
            assert!(validate_subscription(bad).is_err(), "{bad:?}");
        }
        assert!(subscription_matches("*", "anything"));
        assert!(subscription_matches("order.*", "order.created"));
        assert!(subscription_matches("order.*", "order.item.added"));
        assert!(!subscription_matches("order.*", "order"));
        assert!(!subscription_matches("order.*", "orders.created"));
        assert!(subscription_matches("order.created", "order.created"));
        assert!(!subscription_matches("order.created", "order.created.v2"));
    }
}
