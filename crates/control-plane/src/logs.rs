//! Structured logs on stderr: `CONTROLPLANE_LOG` filters (an `EnvFilter`
//! directive such as `info` or `info,dispatcher=debug`),
//! `CONTROLPLANE_LOG_FORMAT` picks text or one JSON object per line.
//!
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, spans are exported over
//! OTLP/HTTP as well: each publish and each delivery attempt, joined to the
//! trace of the request that published the event (README: Tracing).

use std::io::IsTerminal;

use crate::config::{Config, LogFormat};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The spans that are exported, beside every `info` one: the publish (in
/// the API) and the delivery attempt (in the dispatcher), which are `debug`
/// so that they cost nothing when nothing exports them.
const TRACED: [&str; 2] = ["api::routes::events", "dispatcher::worker"];

/// What [`init`] installed that must be flushed at exit.
pub struct Installed {
    traces: Option<SdkTracerProvider>,
}

impl Installed {
    /// Exports the spans still buffered; call it outside the async runtime
    /// (the exporter's client blocks).
    pub fn shutdown(self) {
        if let Some(provider) = self.traces {
            if let Err(e) = provider.shutdown() {
                eprintln!("control-plane: cannot flush the last spans: {e}");
            }
        }
    }
}

/// Installs the process's log subscriber, and the span exporter when the
/// OpenTelemetry variables ask for one. Call it before the async runtime
/// starts: the exporter's HTTP client runs on a thread of its own.
///
/// Whatever `CONTROLPLANE_LOG` asks, `tokio_postgres` logs at `info` at most:
/// its debug lines carry statement parameters, endpoint secrets among them.
///
/// # Errors
/// A `CONTROLPLANE_LOG` that is not a filter directive, or an OTLP setting
/// this build cannot honour, named as such.
pub fn init(config: &Config) -> Result<Installed, String> {
    let filter = EnvFilter::try_new(&config.log)
        .map_err(|e| format!("configuration error: CONTROLPLANE_LOG: {e} (e.g. info or debug)"))?;
    let no_parameters = || {
        Targets::new()
            .with_default(LevelFilter::TRACE)
            .with_target("tokio_postgres", LevelFilter::INFO)
    };
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
    let traces = tracer_provider(|name| std::env::var(name).ok())?;
    let spans = traces.as_ref().map(|provider| {
        let traced = TRACED.iter().fold(
            Targets::new().with_default(LevelFilter::INFO),
            |t, target| t.with_target(*target, LevelFilter::DEBUG),
        );
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("control-plane"))
            .with_filter(traced)
            .with_filter(no_parameters())
    });
    tracing_subscriber::registry()
        .with(lines.with_filter(filter).with_filter(no_parameters()))
        .with(spans)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))?;
    Ok(Installed { traces })
}

/// The span exporter the OpenTelemetry variables describe, if they ask for
/// one (`var` reads a variable). The SDK reads the rest itself
/// (`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*` ...).
fn tracer_provider(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<SdkTracerProvider>, String> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let endpoint =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    if !endpoint.starts_with("http://") {
        return Err(format!(
            "configuration error: OTEL_EXPORTER_OTLP_ENDPOINT {endpoint:?}: this build exports \
             over plain http:// only (a collector or agent beside the service)"
        ));
    }
    let protocol = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .as_deref()
    {
        None | Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => {
            return Err(format!(
                "configuration error: OTEL_EXPORTER_OTLP_PROTOCOL {other:?}: this build exports \
                 http/protobuf or http/json"
            ))
        }
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()
        .map_err(|e| format!("cannot start the OTLP span exporter: {e}"))?;
    let mut resource = Resource::builder();
    if set("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("control-plane");
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
mod tests {
    use super::*;

    fn provider(vars: &[(&str, &str)]) -> Result<Option<SdkTracerProvider>, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tracer_provider(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    /// No endpoint, no exporter; an endpoint this build cannot reach, or a
    /// protocol it does not have, stops the boot with the variable named.
    #[test]
    fn traces_are_exported_only_where_the_variables_say_and_can_be() {
        assert!(provider(&[]).unwrap().is_none());
        assert!(provider(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])
            .unwrap()
            .is_none());
        assert!(provider(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true")
        ])
        .unwrap()
        .is_none());
        let https = provider(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")])
            .err()
            .unwrap();
        assert!(https.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{https}");
        let grpc = provider(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .err()
        .unwrap();
        assert!(
            grpc.contains("OTEL_EXPORTER_OTLP_PROTOCOL \"grpc\""),
            "{grpc}"
        );
        let on = provider(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]).unwrap();
        on.unwrap().shutdown().unwrap();
    }
}
