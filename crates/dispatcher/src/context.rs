//! What every send needs, shared by the in-flight tasks of a dispatcher.

use std::sync::Arc;
use std::time::Duration;

use control_plane_core::Clock;
use control_plane_runtime::UsageMeter;

use crate::metrics::DeliveryMetrics;
use crate::retry::RetryPolicy;

/// What every send needs, shared by the in-flight tasks.
pub(crate) struct SendContext {
    pub(crate) client: crate::http::HttpClient,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: RetryPolicy,
    pub(crate) metrics: Arc<DeliveryMetrics>,
    pub(crate) usage: Arc<UsageMeter>,
    pub(crate) tokens: crate::oauth2::Tokens,
    pub(crate) brokers: crate::broker::Brokers,
    pub(crate) transform: Option<crate::TransformRunner>,
    /// How long a request may take: a transformation must end before the
    /// lease leaves less than this.
    pub(crate) request_timeout: Duration,
}
