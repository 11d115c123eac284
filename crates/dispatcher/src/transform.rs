//! Running an endpoint's jq program (ADR 0050) in a process of its own:
//! jaq bounds neither time, memory nor stack, so a program runs in a child
//! process ([`worker_main`], the binary's `transform` command) with limits
//! on its CPU time, memory and stack, no core dump, the lowest CPU
//! priority, first in line for the OOM killer, an empty environment, its
//! own process group, a wall-clock deadline after which it is killed, and
//! a bounded answer. Whatever the program does, the service sees a body, a
//! drop, or an error (at most [`MAX_ERROR_BYTES`]) it records as a failed
//! attempt. Transformations take turns: at most `at_once` in the process,
//! and at most half of them for one account, so that one tenant's slow
//! programs delay only its own deliveries.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane_core::{run_program, AccountId, Transformed};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// How long a transformation may take, from the start of its process to its
/// answer; past it the process is killed. Less when the delivery's lease
/// leaves less (see [`TransformRunner::run`]).
pub const TRANSFORM_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest error a transformation reports, in bytes: it becomes the
/// attempt's error, kept and shown.
pub const MAX_ERROR_BYTES: usize = 1024;

/// The largest body a transformation may give, in bytes.
pub const MAX_TRANSFORMED_BYTES: usize = 1 << 20;

/// The CPU seconds, the bytes of memory and of stack a transformation's
/// process may use (`RLIMIT_CPU`, `RLIMIT_DATA`, `RLIMIT_STACK`).
const CPU_SECONDS: u64 = 2;
const DATA_BYTES: u64 = 512 << 20;
const STACK_BYTES: u64 = 8 << 20;

/// The largest request a transformation's process reads: a program and a
/// body (bodies are at most 1 MiB when published; JSON escaping may double
/// them).
const MAX_REQUEST_BYTES: u64 = 4 << 20;

/// What the service sends a transformation's process.
#[derive(Serialize, Deserialize)]
struct Request {
    program: String,
    body: String,
}

/// What the process answers: one of the three.
#[derive(Serialize, Deserialize, Default)]
struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    drop: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Starts transformations: the command of a process that runs one
/// ([`worker_main`]), and the turns they take.
#[derive(Clone, Debug)]
pub struct TransformRunner {
    command: PathBuf,
    args: Vec<OsString>,
    running: Arc<Semaphore>,
    /// Turns of each account with transformations waiting or running.
    accounts: Arc<Mutex<HashMap<AccountId, Arc<Semaphore>>>>,
    per_account: usize,
}

impl TransformRunner {
    /// Runs `command args...` for each transformation, at most `at_once`
    /// at a time and at most half of those (one at least) for one account;
    /// the others wait their turn.
    pub fn new(command: impl Into<PathBuf>, args: Vec<OsString>, at_once: usize) -> Self {
        let at_once = at_once.max(1);
        TransformRunner {
            command: command.into(),
            args,
            running: Arc::new(Semaphore::new(at_once)),
            accounts: Arc::default(),
            per_account: (at_once / 2).max(1),
        }
    }

    /// The turns of `account`: its own semaphore, made when first needed
    /// and dropped once no transformation of it waits or runs.
    fn turns_of(&self, account: &AccountId) -> Arc<Semaphore> {
        let Ok(mut map) = self.accounts.lock() else {
            return Arc::new(Semaphore::new(self.per_account));
        };
        map.retain(|_, s| Arc::strong_count(s) > 1);
        map.entry(account.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_account)))
            .clone()
    }

    /// The running binary's own `transform` command, one per core at once.
    ///
    /// # Errors
    /// When the running binary cannot be found.
    pub fn this_binary() -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self::new(
            std::env::current_exe()?,
            vec!["transform".into()],
            cores,
        ))
    }

    /// Runs `program` on `body` of a delivery of `account`, in a process
    /// of its own, within `budget` from now (waiting for a turn included;
    /// at most [`TRANSFORM_TIMEOUT`] of it running): the sender gives what
    /// its lease leaves before the request must start.
    ///
    /// # Errors
    /// Why there is no body: the program's error, no turn or no answer
    /// within the budget, a process that ended without an answer (out of
    /// memory or stack), or an answer too large. The message, at most
    /// [`MAX_ERROR_BYTES`] and a prefix, is the attempt's error.
    pub async fn run(
        &self,
        account: &AccountId,
        program: &str,
        body: &str,
        budget: Duration,
    ) -> Result<Transformed, String> {
        let deadline = Instant::now() + budget;
        let account_turns = self.turns_of(account);
        let turn = async {
            let mine = account_turns.acquire().await;
            let any = self.running.acquire().await;
            (mine, any)
        };
        let (Ok(_mine), Ok(_any)) = tokio::time::timeout_at(deadline.into(), turn)
            .await
            .map_err(|_| {
                "transformation: no turn before the delivery's lease ran short (this \
                 account's other transformations were running)"
                    .to_string()
            })?
        else {
            return Err("transformation: transformations are shut down".into());
        };
        let stop = deadline.min(Instant::now() + TRANSFORM_TIMEOUT);
        self.in_child(program, body, stop).await
    }

    /// The answer of a child process that runs `program` on `body`, killed
    /// at `stop` when it has not answered by then.
    async fn in_child(
        &self,
        program: &str,
        body: &str,
        stop: Instant,
    ) -> Result<Transformed, String> {
        let request = serde_json::to_vec(&Request {
            program: program.into(),
            body: body.into(),
        })
        .map_err(|e| format!("transformation: {e}"))?;
        let mut child = tokio::process::Command::new(&self.command)
            .args(&self.args)
            .env_clear()
            // Its own group: a terminal's Ctrl-C stops the service, which
            // ends its children itself.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("transformation: cannot start its process: {e}"))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("transformation: its process has no pipes".into());
        };
        let exchange = async {
            let write = async {
                // A program that stops reading early closes the pipe: not
                // an error of ours, its answer says what happened.
                let _ = stdin.write_all(&request).await;
                drop(stdin);
            };
            let mut out = Vec::new();
            let mut limited = stdout.take(ANSWER_LIMIT + 1);
            let read = limited.read_to_end(&mut out);
            let ((), read) = tokio::join!(write, read);
            read.map(|_| out)
        };
        let answered = tokio::time::timeout_at(stop.into(), exchange).await;
        // Its answer read (or its time up), the process has nothing more to
        // say: a short wait for its exit status, then it is killed.
        let status = match tokio::time::timeout(Duration::from_millis(200), child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                None
            }
        };
        match answered {
            Ok(Ok(out)) => answer_of(&out, status),
            Ok(Err(e)) => Err(format!("transformation: reading its answer: {e}")),
            Err(_) => Err(format!(
                "transformation: stopped after {:.1} s (the program ran too long)",
                TRANSFORM_TIMEOUT
                    .min(stop.saturating_duration_since(Instant::now()))
                    .as_secs_f64()
            )),
        }
    }
}

/// The most a transformation's answer may hold: a body of
/// [`MAX_TRANSFORMED_BYTES`] as a JSON string (escaping may double it).
const ANSWER_LIMIT: u64 = (MAX_TRANSFORMED_BYTES as u64) * 2 + 4096;

/// `text` cut to at most [`MAX_ERROR_BYTES`], on a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// What the process's output `out` and its exit `status` say.
fn answer_of(out: &[u8], status: Option<std::process::ExitStatus>) -> Result<Transformed, String> {
    if out.len() as u64 > ANSWER_LIMIT {
        return Err(format!(
            "transformation: the program's body is larger than {MAX_TRANSFORMED_BYTES} bytes"
        ));
    }
    match serde_json::from_slice::<Answer>(out) {
        Ok(Answer {
            body: Some(body), ..
        }) => Ok(Transformed::Body(body)),
        Ok(Answer { drop: true, .. }) => Ok(Transformed::Dropped),
        Ok(Answer { error: Some(e), .. }) => Err(format!("transformation: {}", bounded(e))),
        _ => Err(format!(
            "transformation: its process ended without an answer ({}): the program may have \
             run out of memory, stack or CPU time",
            status.map_or_else(|| "did not exit".to_string(), |s| s.to_string())
        )),
    }
}

/// The `transform` command: reads one request from standard input, runs
/// its program under limits on CPU time, memory and stack, without core
/// dumps, at the lowest priority and first in line for the OOM killer, and
/// writes the answer to standard output. The service starts it; people do
/// not. A limit that cannot be set is the answer's error: the program is
/// not run without it.
pub fn worker_main() -> ExitCode {
    let answer = match limit_self() {
        Err(e) => Answer {
            error: Some(format!("cannot limit its process: {e}")),
            ..Answer::default()
        },
        Ok(()) => read_and_run(),
    };
    let Ok(text) = serde_json::to_vec(&answer) else {
        return ExitCode::FAILURE;
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&text).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// The limits of this process, a transformation's.
fn limit_self() -> std::io::Result<()> {
    use rustix::process::{nice, setrlimit, Resource, Rlimit};
    let limit = |resource, soft: u64, hard: u64| {
        setrlimit(
            resource,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
    };
    limit(Resource::Core, 0, 0)?;
    limit(Resource::Cpu, CPU_SECONDS, CPU_SECONDS + 1)?;
    limit(Resource::Data, DATA_BYTES, DATA_BYTES)?;
    limit(Resource::Stack, STACK_BYTES, STACK_BYTES)?;
    nice(19)?;
    // First in line for the OOM killer, before the service.
    std::fs::write("/proc/self/oom_score_adj", "1000")?;
    Ok(())
}

/// Reads the request on standard input and answers it.
fn read_and_run() -> Answer {
    let mut input = Vec::new();
    match std::io::stdin()
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut input)
    {
        Err(e) => Answer {
            error: Some(format!("reading the request: {e}")),
            ..Answer::default()
        },
        Ok(_) => match serde_json::from_slice::<Request>(&input) {
            Err(e) => Answer {
                error: Some(format!("the request is not one: {e}")),
                ..Answer::default()
            },
            Ok(req) => run(&req),
        },
    }
}

/// The answer to `req`.
fn run(req: &Request) -> Answer {
    match run_program(&req.program, &req.body) {
        Ok(Transformed::Body(b)) if b.len() > MAX_TRANSFORMED_BYTES => Answer {
            error: Some(format!(
                "the program's body is {} bytes, more than {MAX_TRANSFORMED_BYTES}",
                b.len()
            )),
            ..Answer::default()
        },
        Ok(Transformed::Body(b)) => Answer {
            body: Some(b),
            ..Answer::default()
        },
        Ok(Transformed::Dropped) => Answer {
            drop: true,
            ..Answer::default()
        },
        Err(e) => Answer {
            error: Some(bounded(e)),
            ..Answer::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_a_body_a_drop_or_an_error() {
        let body = |s: &str| answer_of(s.as_bytes(), None);
        assert_eq!(body(r#"{"body":"{}"}"#), Ok(Transformed::Body("{}".into())));
        assert_eq!(body(r#"{"drop":true}"#), Ok(Transformed::Dropped));
        let e = body(r#"{"error":"boom"}"#).unwrap_err();
        assert_eq!(e, "transformation: boom");
        let e = body("").unwrap_err();
        assert!(e.contains("without an answer"), "{e}");
        let big = vec![b' '; MAX_TRANSFORMED_BYTES * 2 + 5000];
        assert!(answer_of(&big, None).unwrap_err().contains("larger than"));
        // A long error is cut, on a character boundary.
        let long = serde_json::json!({"error": "é".repeat(5000)}).to_string();
        let e = answer_of(long.as_bytes(), None).unwrap_err();
        assert!(
            e.len() <= MAX_ERROR_BYTES + 20 && e.ends_with("..."),
            "{}",
            e.len()
        );
    }
}
