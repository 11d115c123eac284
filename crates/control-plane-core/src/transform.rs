//! Payload transformations (ADR 0050): an endpoint may carry a jq program
//! that rewrites the JSON body of each of its deliveries before it is
//! signed, or drops the delivery by giving `null`. Programs are parsed and
//! compiled by jaq (the `jaq-*` crates), never by our own interpreter.
//!
//! A program is checked here when it is saved ([`Transform::parse`]): a
//! bounded length, and a compile with the standard definitions, whose
//! error is the answer. It is *run* ([`run_program`]) only in a process of
//! its own (`dispatcher::transform`), because jaq bounds neither time nor
//! memory nor stack: `def f: f; f` never returns, `def f: 1+f; f`
//! overflows the stack, `[range(1e9)]` exhausts memory. None of that may
//! reach the service.

use jaq_core::data::JustLut;
use jaq_core::load::{self, Arena, File, Loader};
use jaq_core::native::{bome, run, v, Fun};
use jaq_core::{compile, Compiler, Ctx, Exn, Vars};
use jaq_json::{Num, Val};
use serde::Deserialize;
use serde_json::Value;

use crate::StoreError;

/// The longest program, in bytes.
pub const MAX_PROGRAM_BYTES: usize = 16 * 1024;

/// How deep the brackets of a program may nest: the parser recurses per
/// level, and a stack overflow would end the process that checks it.
const MAX_NESTING: usize = 64;

/// The stack of the thread that checks a program.
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// The most values a program may give before it is stopped (it must give
/// one).
const MAX_OUTPUTS: usize = 2;

/// How deep the body a program gives may nest, and how many values it may
/// hold in all (shared values counted each time they appear).
const MAX_DEPTH: usize = 128;
const MAX_NODES: usize = 1_000_000;

/// A jq program that parses and compiles, as the endpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transform(String);

impl Transform {
    /// The program `text`, checked: at most [`MAX_PROGRAM_BYTES`], brackets
    /// nested at most 64 deep, and compiled with jq's standard definitions
    /// (no modules, no data imports, no `$ENV`).
    ///
    /// # Errors
    /// `InvalidInput` naming the first problem, with its line and column
    /// for a parse or compile error.
    pub fn parse(text: &str) -> Result<Transform, StoreError> {
        let bad = |why: String| StoreError::InvalidInput(format!("transform: {why}"));
        if text.trim().is_empty() {
            return Err(bad("the program is empty".into()));
        }
        if text.len() > MAX_PROGRAM_BYTES {
            return Err(bad(format!(
                "the program is {} bytes, more than {MAX_PROGRAM_BYTES}",
                text.len()
            )));
        }
        if nesting(text) > MAX_NESTING {
            return Err(bad(format!("brackets nest more than {MAX_NESTING} deep")));
        }
        if text.contains('\0') {
            return Err(bad("the program holds a NUL character".into()));
        }
        // The parser recurses: on a thread with a stack no program of the
        // longest length can exhaust, not on the caller's.
        let owned = text.to_string();
        std::thread::Builder::new()
            .name("jq-check".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || compile_program(&owned).map(|_| ()))
            .map_err(|e| bad(format!("cannot check the program: {e}")))?
            .join()
            .map_err(|_| bad("cannot check the program".into()))?
            .map_err(bad)?;
        Ok(Transform(text.to_string()))
    }

    /// A program read back from the store, which checked it when it was
    /// saved.
    pub fn stored(text: String) -> Transform {
        Transform(text)
    }

    /// The program's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The deepest nesting of `(`, `[` and `{` in `text`, outside strings
/// (near enough: an escaped quote is skipped).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// What running a program on a body gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transformed {
    /// The body to send instead (JSON text).
    Body(String),
    /// The program gave `null`: the delivery is not sent.
    Dropped,
}

type D = JustLut<Val>;

/// Natives of jaq's standard library replaced by [`stubs`]: `env` (the
/// process environment), `halt` (would stop the process) and the two that
/// write to the host's log.
const REPLACED: [&str; 4] = ["env", "halt", "debug_empty", "stderr_empty"];

fn stubs() -> [Fun<D>; 4] {
    [
        run::<D>(("env", v(0), |_| {
            bome(Err(jaq_json::Error::str("env is not available")))
        })),
        run::<D>(("halt", v(1), |_| {
            bome(Err(jaq_json::Error::str("halt is not available")))
        })),
        run::<D>(("debug_empty", v(0), |_| Box::new(core::iter::empty()))),
        run::<D>(("stderr_empty", v(0), |_| Box::new(core::iter::empty()))),
    ]
}

fn funs() -> impl Iterator<Item = Fun<D>> {
    let std = jaq_std::funs::<D>().filter(|(name, _, _)| !REPLACED.contains(name));
    stubs()
        .into_iter()
        .chain(jaq_core::funs::<D>())
        .chain(std)
        .chain(jaq_json::funs::<D>())
}

/// `text` compiled, or its errors with their line and column.
fn compile_program(text: &str) -> Result<jaq_core::Filter<D>, String> {
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let arena = Arena::default();
    // The default loader refuses `include` and `import` of modules.
    let modules = Loader::new(defs)
        .load(
            &arena,
            File {
                code: text,
                path: (),
            },
        )
        .map_err(|errs| load_errors(&errs))?;
    // A data import (`import "f" as $x;`) would leave a variable unset.
    load::import(&modules, |_| {
        Err("data imports are not supported".to_owned())
    })
    .map_err(|errs| load_errors(&errs))?;
    Compiler::default()
        .with_funs(funs())
        .compile(modules)
        .map_err(|errs| compile_errors(&errs))
}

/// Runs `program` on the JSON `body`: the one value it gives, as JSON
/// text, or [`Transformed::Dropped`] for `null`.
///
/// Only ever call this in a process of its own, with limits on its time
/// and memory (`dispatcher::transform`): see the module's documentation.
///
/// # Errors
/// The program's own error, a body that is not JSON, no value or more
/// than one, or a value that JSON cannot hold.
pub fn run_program(program: &str, body: &str) -> Result<Transformed, String> {
    let filter = compile_program(program)?;
    let input: Value =
        serde_json::from_str(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let input = Val::deserialize(&input).map_err(|e| format!("the body is not JSON: {e}"))?;
    let ctx = Ctx::<D>::new(&filter.lut, Vars::new([]));
    let mut outputs = Vec::new();
    let mut nodes = 0;
    for result in filter.id.run((ctx, input)) {
        if outputs.len() == MAX_OUTPUTS - 1 {
            return Err("the program gave more than one value; it must give one \
                        (or null to drop the delivery)"
                .into());
        }
        let value = result.map_err(exn_message)?;
        outputs.push(to_json(&value, 0, &mut nodes)?);
    }
    match outputs.pop() {
        None => Err("the program gave no value; it must give one \
                     (or null to drop the delivery)"
            .into()),
        Some(Value::Null) => Ok(Transformed::Dropped),
        Some(v) => Ok(Transformed::Body(v.to_string())),
    }
}

fn exn_message(e: Exn<'_, Val>) -> String {
    match e.get_err() {
        Ok(err) => match err.into_val() {
            Val::TStr(s) => format!("the program failed: {}", String::from_utf8_lossy(&s)),
            other => format!("the program failed: {other}"),
        },
        Err(e) => match e.get_halt() {
            Ok(code) => format!("the program halted with exit code {code}"),
            Err(_) => "the program stopped without a value".to_owned(),
        },
    }
}

fn to_json(v: &Val, depth: usize, nodes: &mut usize) -> Result<Value, String> {
    *nodes += 1;
    if depth > MAX_DEPTH || *nodes > MAX_NODES {
        return Err("the program's value is too large or nests too deep".to_owned());
    }
    Ok(match v {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(*b),
        Val::Num(n) => number(n),
        Val::TStr(s) => Value::String(String::from_utf8_lossy(s).into_owned()),
        Val::BStr(_) => return Err("the program's value holds a byte string".to_owned()),
        Val::Arr(a) => Value::Array(
            a.iter()
                .map(|x| to_json(x, depth + 1, nodes))
                .collect::<Result<_, _>>()?,
        ),
        Val::Obj(o) => {
            let mut map = serde_json::Map::new();
            for (k, x) in o.iter() {
                let Val::TStr(key) = k else {
                    return Err(format!(
                        "the program's value has a key that is not a string: {k}"
                    ));
                };
                map.insert(
                    String::from_utf8_lossy(key).into_owned(),
                    to_json(x, depth + 1, nodes)?,
                );
            }
            Value::Object(map)
        }
    })
}

/// A jq number as JSON; what JSON cannot hold (NaN, infinities) is `null`,
/// as jq prints it.
fn number(n: &Num) -> Value {
    match n {
        Num::Int(i) => Value::Number(serde_json::Number::from(*i)),
        Num::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Num::BigInt(_) | Num::Dec(_) => n
            .to_string()
            .parse::<serde_json::Number>()
            .map_or(Value::Null, Value::Number),
    }
}

fn load_errors(errs: &load::Errors<&str, ()>) -> String {
    let mut msgs = Vec::new();
    for (file, err) in errs {
        match err {
            load::Error::Io(es) => {
                for (path, e) in es {
                    msgs.push(format!("{}: cannot load {path}: {e}", at(file.code, path)));
                }
            }
            load::Error::Lex(es) => msgs.extend(
                es.iter()
                    .map(|(expected, found)| expected_at(file.code, expected.as_str(), found)),
            ),
            load::Error::Parse(es) => msgs.extend(
                es.iter()
                    .map(|(expected, found)| expected_at(file.code, expected.as_str(), found)),
            ),
        }
    }
    msgs.join("; ")
}

/// A lexer's or parser's error: where, what it expected, what it found.
fn expected_at(code: &str, expected: &str, found: &str) -> String {
    format!(
        "{}: expected {expected}, found {}",
        at(code, found),
        found_text(found)
    )
}

fn compile_errors(errs: &compile::Errors<&str, ()>) -> String {
    use compile::Undefined;
    let mut msgs = Vec::new();
    for (file, es) in errs {
        for (name, undefined) in es {
            let msg = match undefined {
                Undefined::Filter(n) => format!("undefined filter {name}/{n}"),
                other => format!("undefined {} {name}", other.as_str()),
            };
            msgs.push(format!("{}: {msg}", at(file.code, name)));
        }
    }
    msgs.join("; ")
}

/// `line:column` of `part` within `code` (it is a slice of it; otherwise
/// the standard definitions).
fn at(code: &str, part: &str) -> String {
    let start = (part.as_ptr() as usize).wrapping_sub(code.as_ptr() as usize);
    match code.get(..start) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("{line}:{col}")
        }
        None => "the standard definitions".to_owned(),
    }
}

/// The start of what the parser found: errors carry the rest of the input.
fn found_text(found: &str) -> String {
    if found.is_empty() {
        "the end of the program".to_owned()
    } else {
        format!("{:?}", found.chars().take(20).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_does_not_parse_is_refused_with_where() {
        let e = Transform::parse(".a |").unwrap_err().to_string();
        assert!(e.contains("1:5") && e.contains("expected"), "{e}");
        let e = Transform::parse("foo(1)").unwrap_err().to_string();
        assert!(e.contains("undefined filter foo/1"), "{e}");
        let e = Transform::parse("$ENV").unwrap_err().to_string();
        assert!(e.contains("undefined"), "{e}");
        let e = Transform::parse("include \"x\"; .")
            .unwrap_err()
            .to_string();
        assert!(e.contains("transform:"), "{e}");
        let e = Transform::parse("import \"f\" as $x; .")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data imports"), "{e}");
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        let e = Transform::parse(&deep).unwrap_err().to_string();
        assert!(e.contains("nest"), "{e}");
        let long = format!(".a{}", " ".repeat(MAX_PROGRAM_BYTES));
        assert!(Transform::parse(&long).is_err());
        assert!(Transform::parse("  ").is_err());
        assert!(Transform::parse("{a: .data.id, kind: .type}").is_ok());
        // Brackets inside strings do not count.
        let s = format!("\"{}\"", "[".repeat(100));
        assert!(Transform::parse(&s).is_ok());
        // The longest program of constructs that nest without brackets is
        // checked on the check's own stack without exhausting it.
        let unary = format!("{}1", "-".repeat(MAX_PROGRAM_BYTES - 1));
        let _ = Transform::parse(&unary);
        let ifs = format!(
            "{}1{}",
            "if . then ".repeat(MAX_PROGRAM_BYTES / 24),
            " else 0 end".repeat(MAX_PROGRAM_BYTES / 24)
        );
        assert!(ifs.len() <= MAX_PROGRAM_BYTES);
        let _ = Transform::parse(&ifs);
        let tries = format!("{}1", "try ".repeat(MAX_PROGRAM_BYTES / 4 - 1));
        let _ = Transform::parse(&tries);
    }

    #[test]
    fn a_program_rewrites_the_body_or_drops_it() {
        let body = r#"{"type":"order.paid","data":{"id":7,"total":12.5}}"#;
        assert_eq!(
            run_program("{id: .data.id, kind: .type}", body),
            Ok(Transformed::Body(r#"{"id":7,"kind":"order.paid"}"#.into()))
        );
        assert_eq!(
            run_program("if .data.total > 100 then . else null end", body),
            Ok(Transformed::Dropped)
        );
        let e = run_program(".data[]", body).unwrap_err();
        assert!(e.contains("more than one value"), "{e}");
        let e = run_program("empty", body).unwrap_err();
        assert!(e.contains("no value"), "{e}");
        let e = run_program("error(\"no thanks\")", body).unwrap_err();
        assert!(e.contains("no thanks"), "{e}");
        let e = run_program("env", body).unwrap_err();
        assert!(e.contains("env is not available"), "{e}");
        let e = run_program("halt", body).unwrap_err();
        assert!(e.contains("halt is not available"), "{e}");
        let e = run_program(".", "not json").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        // Shared values that would print exponentially are stopped.
        let e = run_program("reduce range(40) as $_ (0; [., .])", body).unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }
}
