//! Structured logs on stderr: `CONTROLPLANE_LOG` filters (an `EnvFilter`
//! directive such as `info` or `info,dispatcher=debug`),
//! `CONTROLPLANE_LOG_FORMAT` picks text or one JSON object per line.

use std::io::IsTerminal;

use control_plane_core::config::LogFormat;
use control_plane_core::Config;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the process's log subscriber.
///
/// Whatever `CONTROLPLANE_LOG` asks, `tokio_postgres` logs at `info` at most:
/// its debug lines carry statement parameters, endpoint secrets among them.
///
/// # Errors
/// A `CONTROLPLANE_LOG` that is not a filter directive, named as such.
pub fn init(config: &Config) -> Result<(), String> {
    let filter = EnvFilter::try_new(&config.log)
        .map_err(|e| format!("configuration error: CONTROLPLANE_LOG: {e} (e.g. info or debug)"))?;
    let no_parameters = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("tokio_postgres", LevelFilter::INFO);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match config.log_format {
        LogFormat::Text => lines.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(lines.with_filter(filter).with_filter(no_parameters))
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))
}
