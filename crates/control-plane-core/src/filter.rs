//! Endpoint filters on an event's type and payload (ADR 0024).
//!
//! A filter is a JSON object tested against the document
//! `{"type": <event type>, "data": <payload>}`:
//!
//! - every entry of the object must hold (an implicit `and`);
//! - a key is a dotted path into that document (`data.order.total`,
//!   `data.items.0.sku`: a number segment indexes an array), or one of
//!   `$and` and `$or` (an array of 1 to 16 filters) or `$not` (a filter);
//! - a path's value is either a plain value, which the field must equal, or
//!   an object of operators, all of which must hold: `$eq`, `$ne`, `$gt`,
//!   `$gte`, `$lt`, `$lte` (numbers with numbers, strings with strings),
//!   `$in`, `$nin` (an array of values) and `$exists` (`true` or `false`).
//!
//! Numbers are equal by value (`1` equals `1.0`). A comparison of values of
//! different types does not hold, and a path that leads nowhere holds only
//! for `$exists: false`, `$ne` and `$nin`: a payload the filter cannot
//! evaluate does not match, and never fails the publish. A filter is
//! checked when it is set ([`EventFilter::parse`]); an evaluation never
//! panics and never fails.

use serde_json::{Map, Number, Value};

use crate::StoreError;

/// Nesting of `$and`, `$or` and `$not` at most.
pub const MAX_FILTER_DEPTH: usize = 8;
/// Conditions (path entries) in one filter at most.
pub const MAX_FILTER_CONDITIONS: usize = 64;
/// A filter's JSON text, in bytes, at most.
pub const MAX_FILTER_BYTES: usize = 4096;
/// Filters in one `$and` or `$or` at most, and values in one `$in` or `$nin`.
pub const MAX_FILTER_ITEMS: usize = 16;

/// A checked filter, kept as the JSON its owner wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFilter(Map<String, Value>);

impl EventFilter {
    /// Checks `v` as a filter.
    ///
    /// # Errors
    /// `InvalidInput` naming where the filter is wrong and why.
    pub fn parse(v: Value) -> Result<Self, StoreError> {
        let bytes = v.to_string().len();
        if bytes > MAX_FILTER_BYTES {
            return Err(invalid(
                "",
                &format!("is {bytes} bytes long; at most {MAX_FILTER_BYTES}"),
            ));
        }
        Self::checked(v)
    }

    /// The structure checks of [`EventFilter::parse`], without its size
    /// limit (a stored filter whose text grew in a round trip still reads).
    fn checked(v: Value) -> Result<Self, StoreError> {
        let Value::Object(map) = v else {
            return Err(invalid("", "must be a JSON object"));
        };
        let mut conditions = 0;
        check_filter(&map, "", 0, &mut conditions)?;
        Ok(EventFilter(map))
    }

    /// The filter as stored text.
    pub fn to_text(&self) -> String {
        Value::Object(self.0.clone()).to_string()
    }

    /// A filter read back from its stored text.
    ///
    /// # Errors
    /// `Backend` when the text is not a valid filter (the store was changed
    /// by hand).
    pub fn from_text(text: &str) -> Result<Self, StoreError> {
        serde_json::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(|v| EventFilter::checked(v).map_err(|e| e.to_string()))
            .map_err(|e| StoreError::Backend(format!("a stored endpoint filter: {e}")))
    }

    /// The filter as JSON.
    pub fn to_json(&self) -> Value {
        Value::Object(self.0.clone())
    }

    /// Whether an event of `event_type` with `payload` passes.
    pub fn matches(&self, event_type: &str, payload: &Value) -> bool {
        let doc = Document {
            event_type,
            payload,
        };
        holds(&self.0, &doc)
    }
}

/// The document a filter is tested against, without building it.
struct Document<'a> {
    event_type: &'a str,
    payload: &'a Value,
}

/// An event type as a JSON value, for the `type` path.
enum Found<'a> {
    Type(&'a str),
    Value(&'a Value),
}

impl Document<'_> {
    fn get(&self, path: &str) -> Option<Found<'_>> {
        let mut segments = path.split('.');
        match segments.next()? {
            "type" => segments
                .next()
                .is_none()
                .then_some(Found::Type(self.event_type)),
            "data" => {
                let mut at = self.payload;
                for s in segments {
                    at = match at {
                        Value::Object(m) => m.get(s)?,
                        Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
                        _ => return None,
                    };
                }
                Some(Found::Value(at))
            }
            _ => None,
        }
    }
}

fn invalid(at: &str, why: &str) -> StoreError {
    if at.is_empty() {
        StoreError::InvalidInput(format!("filter {why}"))
    } else {
        StoreError::InvalidInput(format!("filter at {at}: {why}"))
    }
}

fn joined(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn check_filter(
    map: &Map<String, Value>,
    at: &str,
    depth: usize,
    conditions: &mut usize,
) -> Result<(), StoreError> {
    if depth > MAX_FILTER_DEPTH {
        return Err(invalid(
            at,
            &format!("nests $and, $or and $not more than {MAX_FILTER_DEPTH} deep"),
        ));
    }
    if map.is_empty() {
        return Err(invalid(
            at,
            "is an empty object; give at least one condition",
        ));
    }
    for (key, v) in map {
        let here = joined(at, key);
        match key.as_str() {
            "$and" | "$or" => {
                let Value::Array(items) = v else {
                    return Err(invalid(&here, "must be an array of filters"));
                };
                if items.is_empty() || items.len() > MAX_FILTER_ITEMS {
                    return Err(invalid(
                        &here,
                        &format!("must hold 1 to {MAX_FILTER_ITEMS} filters"),
                    ));
                }
                for (i, item) in items.iter().enumerate() {
                    let Value::Object(m) = item else {
                        return Err(invalid(&format!("{here}[{i}]"), "must be an object"));
                    };
                    check_filter(m, &format!("{here}[{i}]"), depth + 1, conditions)?;
                }
            }
            "$not" => {
                let Value::Object(m) = v else {
                    return Err(invalid(&here, "must be an object"));
                };
                check_filter(m, &here, depth + 1, conditions)?;
            }
            k if k.starts_with('$') => {
                return Err(invalid(
                    &here,
                    "is not an operator here; use $and, $or or $not, or a path such as data.amount",
                ));
            }
            path => {
                check_path(path, &here)?;
                *conditions += 1;
                if *conditions > MAX_FILTER_CONDITIONS {
                    return Err(invalid(
                        &here,
                        &format!("the filter has more than {MAX_FILTER_CONDITIONS} conditions"),
                    ));
                }
                check_condition(v, &here)?;
            }
        }
    }
    Ok(())
}

fn check_path(path: &str, at: &str) -> Result<(), StoreError> {
    let mut segments = path.split('.');
    let ok = match segments.next() {
        Some("type") => segments.next().is_none(),
        Some("data") => segments.all(|s| !s.is_empty()),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(invalid(
            at,
            "a path is `type`, `data`, or `data.` followed by dotted keys (such as data.order.total)",
        ))
    }
}

fn check_condition(v: &Value, at: &str) -> Result<(), StoreError> {
    let Value::Object(ops) = v else {
        return Ok(());
    };
    let operators = ops.keys().filter(|k| k.starts_with('$')).count();
    if operators == 0 {
        return Ok(());
    }
    if operators != ops.len() || ops.is_empty() {
        return Err(invalid(
            at,
            "mixes operators ($...) and plain keys; wrap a plain object in $eq",
        ));
    }
    for (op, operand) in ops {
        let here = joined(at, op);
        match op.as_str() {
            "$eq" | "$ne" => {}
            "$gt" | "$gte" | "$lt" | "$lte" => {
                if !(operand.is_number() || operand.is_string()) {
                    return Err(invalid(&here, "compares with a number or a string"));
                }
            }
            "$in" | "$nin" => match operand {
                Value::Array(a) if !a.is_empty() && a.len() <= MAX_FILTER_ITEMS => {}
                _ => {
                    return Err(invalid(
                        &here,
                        &format!("must be an array of 1 to {MAX_FILTER_ITEMS} values"),
                    ))
                }
            },
            "$exists" => {
                if !operand.is_boolean() {
                    return Err(invalid(&here, "must be true or false"));
                }
            }
            _ => {
                return Err(invalid(
                    &here,
                    "is not an operator; use $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin or $exists",
                ))
            }
        }
    }
    Ok(())
}

fn holds(map: &Map<String, Value>, doc: &Document<'_>) -> bool {
    map.iter().all(|(key, v)| match key.as_str() {
        "$and" => as_filters(v).all(|m| holds(m, doc)),
        "$or" => as_filters(v).any(|m| holds(m, doc)),
        "$not" => matches!(v, Value::Object(m) if !holds(m, doc)),
        path => condition_holds(doc.get(path), v),
    })
}

fn as_filters(v: &Value) -> impl Iterator<Item = &Map<String, Value>> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn condition_holds(found: Option<Found<'_>>, condition: &Value) -> bool {
    match condition {
        Value::Object(ops) if !ops.is_empty() && ops.keys().all(|k| k.starts_with('$')) => ops
            .iter()
            .all(|(op, operand)| operator_holds(found.as_ref(), op, operand)),
        plain => found.as_ref().is_some_and(|f| equal(f, plain)),
    }
}

fn operator_holds(found: Option<&Found<'_>>, op: &str, operand: &Value) -> bool {
    let in_list = |f: &Found<'_>| {
        operand
            .as_array()
            .is_some_and(|a| a.iter().any(|x| equal(f, x)))
    };
    match (op, found) {
        ("$exists", f) => operand.as_bool() == Some(f.is_some()),
        ("$ne", None) | ("$nin", None) => true,
        (_, None) => false,
        ("$eq", Some(f)) => equal(f, operand),
        ("$ne", Some(f)) => !equal(f, operand),
        ("$in", Some(f)) => in_list(f),
        ("$nin", Some(f)) => !in_list(f),
        ("$gt", Some(f)) => compare(f, operand).is_some_and(|o| o.is_gt()),
        ("$gte", Some(f)) => compare(f, operand).is_some_and(|o| o.is_ge()),
        ("$lt", Some(f)) => compare(f, operand).is_some_and(|o| o.is_lt()),
        ("$lte", Some(f)) => compare(f, operand).is_some_and(|o| o.is_le()),
        _ => false,
    }
}

/// Two numbers in order: exactly when both are integers (so ids above
/// 2^53 stay apart), as floats otherwise.
fn order(a: &Number, b: &Number) -> Option<std::cmp::Ordering> {
    match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
        (Some(x), Some(y), _, _) => Some(x.cmp(&y)),
        (_, _, Some(x), Some(y)) => Some(x.cmp(&y)),
        (Some(_), _, _, Some(_)) => Some(std::cmp::Ordering::Less),
        (_, Some(_), Some(_), _) => Some(std::cmp::Ordering::Greater),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

fn equal(found: &Found<'_>, v: &Value) -> bool {
    match (found, v) {
        (Found::Type(t), Value::String(s)) => t == s,
        (Found::Type(_), _) => false,
        (Found::Value(Value::Number(a)), Value::Number(b)) => {
            order(a, b).is_some_and(|o| o.is_eq())
        }
        (Found::Value(a), b) => *a == b,
    }
}

fn compare(found: &Found<'_>, v: &Value) -> Option<std::cmp::Ordering> {
    match (found, v) {
        (Found::Type(t), Value::String(s)) => Some((*t).cmp(s.as_str())),
        (Found::Value(Value::String(a)), Value::String(b)) => Some(a.as_str().cmp(b.as_str())),
        (Found::Value(Value::Number(a)), Value::Number(b)) => order(a, b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(v: Value) -> EventFilter {
        EventFilter::parse(v).expect("a valid filter")
    }

    #[test]
    fn plain_values_and_operators_match_the_payload_and_type() {
        let payload =
            json!({"amount": 150, "currency": "EUR", "items": [{"sku": "a-1"}], "note": null});
        let m = |v: Value| f(v).matches("order.paid", &payload);
        assert!(m(json!({"data.currency": "EUR"})));
        assert!(!m(json!({"data.currency": "USD"})));
        assert!(m(json!({"data.amount": 150.0})));
        assert!(m(json!({"data.amount": {"$gte": 100, "$lt": 200}})));
        assert!(!m(json!({"data.amount": {"$gt": 150}})));
        assert!(m(json!({"data.items.0.sku": {"$in": ["a-1", "b-2"]}})));
        assert!(!m(json!({"data.items.1.sku": {"$in": ["a-1"]}})));
        assert!(m(json!({"type": {"$in": ["order.paid", "order.created"]}})));
        assert!(m(json!({"type": "order.paid", "data.note": null})));
        assert!(m(
            json!({"data.missing": {"$exists": false}, "data.note": {"$exists": true}})
        ));
        assert!(m(
            json!({"$or": [{"data.currency": "USD"}, {"data.amount": {"$gt": 100}}]})
        ));
        assert!(!m(
            json!({"$and": [{"data.currency": "EUR"}, {"data.amount": {"$gt": 200}}]})
        ));
        assert!(m(json!({"$not": {"data.currency": "USD"}})));
        assert!(m(
            json!({"data.missing": {"$ne": 1}, "data.currency": {"$nin": ["USD"]}})
        ));
    }

    #[test]
    fn values_of_another_type_do_not_match() {
        let filter = f(json!({"data.amount": {"$gte": 100}}));
        assert!(!filter.matches("t", &json!({"amount": "150"})));
        assert!(!filter.matches("t", &json!({"amount": null})));
        assert!(!filter.matches("t", &json!("not an object")));
        assert!(!filter.matches("t", &json!({})));
        assert!(filter.matches("t", &json!({"amount": 100})));
    }

    #[test]
    fn malformed_filters_are_refused_naming_where() {
        let err = |v: Value| match EventFilter::parse(v) {
            Err(StoreError::InvalidInput(m)) => m,
            other => panic!("expected InvalidInput, got {other:?}"),
        };
        assert!(err(json!([1])).contains("must be a JSON object"));
        assert!(err(json!({})).contains("empty object"));
        assert!(err(json!({"data.amount": {"$gtx": 1}})).contains("data.amount.$gtx"));
        assert!(err(json!({"amount": 1})).contains("a path is"));
        assert!(err(json!({"data.a": {"$gt": true}})).contains("number or a string"));
        assert!(err(json!({"data.a": {"$in": []}})).contains("1 to 16"));
        assert!(err(json!({"$or": [{"data.a": 1}, 2]})).contains("$or[1]"));
        assert!(err(json!({"data.a": {"$eq": 1, "b": 2}})).contains("mixes"));
        assert!(err(json!({"$where": "x"})).contains("not an operator here"));
        let mut deep = json!({"data.a": 1});
        for _ in 0..=MAX_FILTER_DEPTH {
            deep = json!({ "$not": deep });
        }
        assert!(err(deep).contains("deep"));
    }

    #[test]
    fn a_filter_survives_its_stored_text() {
        let filter = f(json!({"data.amount": {"$gte": 100}, "type": "a"}));
        assert_eq!(EventFilter::from_text(&filter.to_text()).ok(), Some(filter));
        assert!(EventFilter::from_text("{").is_err());
    }

    mod never_panics {
        use super::*;
        use proptest::prelude::*;

        fn key() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "$and", "$or", "$not", "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin",
                "$exists", "$x", "type", "type.x", "data", "data.a", "data.a.0", "data.a.b", "a",
                "", ".",
            ])
            .prop_map(String::from)
        }

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                "[a-z0-9$.]{0,6}".prop_map(Value::from),
            ];
            leaf.prop_recursive(5, 48, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    prop::collection::btree_map(key(), inner, 0..5)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn checking_and_evaluating_any_json_never_panics(
                filter in json(),
                payload in json(),
                event_type in "[a-z.]{0,8}",
            ) {
                if let Ok(f) = EventFilter::parse(filter) {
                    let decided = f.matches(&event_type, &payload);
                    // Stored and read back, it decides alike. (Not always
                    // equal: serde_json reads some long floats back one
                    // unit off in the last place.)
                    let back = EventFilter::from_text(&f.to_text());
                    prop_assert!(back.is_ok(), "{:?}", back);
                    if let Ok(back) = back {
                        prop_assert_eq!(back.matches(&event_type, &payload), decided);
                    }
                }
            }
        }
    }
}
