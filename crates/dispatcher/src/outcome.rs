//! An attempt's outcome where no answer decides it: the endpoint's
//! transformation (ADR 0050) giving another body, dropping the delivery
//! or failing, and the classification every failed attempt goes through.

use std::time::Duration;

use control_plane_core::{AttemptReport, ClaimedDelivery, DeliveryOutcome, Transformed};

use crate::classify::{classify, SendResult};
use crate::context::SendContext;

/// The attempt note of a delivery its endpoint's program dropped.
pub const DROPPED: &str = "not sent: the endpoint's transformation gave null";

/// The body the endpoint's program gives for `c`, `None` when it has no
/// program; or, as `Err`, the attempt's outcome without a request: a drop,
/// or a failure (retried on the endpoint's schedule). The program has what
/// the lease leaves before the request must start.
pub(crate) async fn transform(
    ctx: &SendContext,
    c: &ClaimedDelivery,
) -> Result<Option<String>, DeliveryOutcome> {
    let Some(program) = &c.transform else {
        return Ok(None);
    };
    let Some(runner) = &ctx.transform else {
        let why = "transformation: this process cannot run transformations".to_string();
        return Err(settle(ctx, c, unsent_result(why), None));
    };
    let left = c.lease.expires_at.as_millis() - ctx.clock.now().as_millis();
    let budget =
        Duration::from_millis(u64::try_from(left).unwrap_or(0)).saturating_sub(ctx.request_timeout);
    match runner
        .run(&c.delivery.account, program.as_str(), &c.body, budget)
        .await
    {
        Ok(Transformed::Body(body)) => Ok(Some(body)),
        Ok(Transformed::Dropped) => Err(dropped(ctx, c)),
        Err(why) => Err(settle(ctx, c, unsent_result(why), None)),
    }
}

/// The outcome of an attempt that gave `result`: classified on the
/// endpoint's own retry schedule when it has one (the service's otherwise),
/// and counted.
pub(crate) fn settle(
    ctx: &SendContext,
    c: &ClaimedDelivery,
    result: SendResult,
    took: Option<Duration>,
) -> DeliveryOutcome {
    let own = c
        .retry
        .as_ref()
        .map(|r| crate::retry::for_endpoint(&ctx.policy, r));
    let outcome = classify(
        &result,
        c.lease.attempt,
        c.delivery.id.0.as_bytes(),
        own.as_ref().unwrap_or(&ctx.policy),
        ctx.clock.now(),
    );
    ctx.metrics
        .record(&c.delivery.account, outcome.kind(), took);
    outcome
}

/// A delivery its endpoint's program dropped (it gave `null`): finished
/// without a request, its attempt saying why.
fn dropped(ctx: &SendContext, c: &ClaimedDelivery) -> DeliveryOutcome {
    let outcome = DeliveryOutcome::Delivered(AttemptReport {
        status_code: None,
        error: Some(DROPPED.into()),
        latency_ms: 0,
        response_body: None,
    });
    ctx.metrics
        .record(&c.delivery.account, outcome.kind(), None);
    outcome
}

/// An attempt that made no request, failed as `error` says.
pub(crate) fn unsent_result(error: String) -> SendResult {
    SendResult {
        status: None,
        retry_after: None,
        error: Some(error),
        latency_ms: 0,
        response_body: None,
        acked: false,
    }
}
