//! Running an endpoint's jq program (ADR 0050) in a process of its own:
//! jaq bounds neither time, memory nor stack, so a program runs in a child
//! process ([`worker_main`], the binary's `transform` command) with limits
//! on its CPU time and memory, an empty environment, a wall-clock timeout
//! after which it is killed, and a bounded answer. Whatever the program
//! does, the service sees a body, a drop, or an error it records as a
//! failed attempt.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use control_plane_core::{run_program, Transformed};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// How long a transformation may take, from the start of its process to its
/// answer; past it the process is killed.
pub const TRANSFORM_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest body a transformation may give, in bytes.
pub const MAX_TRANSFORMED_BYTES: usize = 1 << 20;

/// The CPU seconds and the bytes of memory a transformation's process may
/// use (`RLIMIT_CPU`, `RLIMIT_DATA`).
const CPU_SECONDS: u64 = 2;
const DATA_BYTES: u64 = 512 << 20;

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
/// ([`worker_main`]), and how many may run at once.
#[derive(Clone, Debug)]
pub struct TransformRunner {
    command: PathBuf,
    args: Vec<OsString>,
    running: Arc<Semaphore>,
}

impl TransformRunner {
    /// Runs `command args...` for each transformation, at most `at_once`
    /// at a time (the others wait their turn).
    pub fn new(command: impl Into<PathBuf>, args: Vec<OsString>, at_once: usize) -> Self {
        TransformRunner {
            command: command.into(),
            args,
            running: Arc::new(Semaphore::new(at_once.max(1))),
        }
    }

    /// The running binary's own `transform` command, two per core at once.
    ///
    /// # Errors
    /// When the running binary cannot be found.
    pub fn this_binary() -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self::new(
            std::env::current_exe()?,
            vec!["transform".into()],
            2 * cores,
        ))
    }

    /// Runs `program` on `body` in a process of its own.
    ///
    /// # Errors
    /// Why there is no body: the program's error, a timeout, a process that
    /// ended without an answer (out of memory or stack), or an answer too
    /// large. The message is the attempt's error.
    pub async fn run(&self, program: &str, body: &str) -> Result<Transformed, String> {
        let _turn = self
            .running
            .acquire()
            .await
            .map_err(|_| "transformations are shut down".to_string())?;
        let request = serde_json::to_vec(&Request {
            program: program.into(),
            body: body.into(),
        })
        .map_err(|e| format!("transformation: {e}"))?;
        let mut child = tokio::process::Command::new(&self.command)
            .args(&self.args)
            .env_clear()
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
            let limit = (MAX_TRANSFORMED_BYTES as u64) * 2 + 4096;
            let mut out = Vec::new();
            let mut limited = stdout.take(limit + 1);
            let read = limited.read_to_end(&mut out);
            let ((), read) = tokio::join!(write, read);
            read.map(|_| out)
        };
        let out = match tokio::time::timeout(TRANSFORM_TIMEOUT, exchange).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(format!("transformation: reading its answer: {e}")),
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(format!(
                    "transformation: stopped after {} s (the program ran too long)",
                    TRANSFORM_TIMEOUT.as_secs()
                ));
            }
        };
        let status = match tokio::time::timeout(TRANSFORM_TIMEOUT, child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                let _ = child.start_kill();
                None
            }
        };
        answer_of(&out, status)
    }
}

/// What the process's output `out` and its exit `status` say.
fn answer_of(out: &[u8], status: Option<std::process::ExitStatus>) -> Result<Transformed, String> {
    if out.len() > MAX_TRANSFORMED_BYTES * 2 + 4096 {
        return Err(format!(
            "transformation: the program's body is larger than {MAX_TRANSFORMED_BYTES} bytes"
        ));
    }
    match serde_json::from_slice::<Answer>(out) {
        Ok(Answer {
            body: Some(body), ..
        }) => Ok(Transformed::Body(body)),
        Ok(Answer { drop: true, .. }) => Ok(Transformed::Dropped),
        Ok(Answer { error: Some(e), .. }) => Err(format!("transformation: {e}")),
        _ => Err(format!(
            "transformation: its process ended without an answer ({}): the program may have \
             run out of memory, stack or CPU time",
            status.map_or_else(|| "did not exit".to_string(), |s| s.to_string())
        )),
    }
}

/// The `transform` command: reads one request from standard input, runs
/// its program under limits on CPU time and memory, and writes the answer
/// to standard output. The service starts it; people do not.
pub fn worker_main() -> ExitCode {
    // Best effort: a refused limit still leaves the parent's timeout.
    let _ = rlimit::setrlimit(rlimit::Resource::CPU, CPU_SECONDS, CPU_SECONDS + 1);
    let _ = rlimit::setrlimit(rlimit::Resource::DATA, DATA_BYTES, DATA_BYTES);
    let mut input = Vec::new();
    let answer = match std::io::stdin()
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
            error: Some(e),
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
    }
}
