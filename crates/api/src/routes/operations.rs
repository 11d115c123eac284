//! Operations: metered usage and alerts.

use super::{
    ok, unix_seconds, AccountPath, AlertView, Answer, ApiError, Deserialize, Duration, IntoParams,
    Listing, PageQuery, Query, Scope, Shared, State, StatusCode, UsageList, UsageView,
};
use control_plane_core::TimeRange;

/// The time range of a usage query.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// From this time (Unix seconds); default 24 h before `to`.
    from: Option<i64>,
    /// Until this time (Unix seconds); default now.
    to: Option<i64>,
}

/// Usage counters by hour.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/usage",
    tag = "usage",
    params(AccountPath, UsageQuery),
    responses((status = 200, description = "Hourly counters", body = UsageList)),
)]
pub(crate) async fn usage(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<UsageQuery>,
) -> Answer {
    let to = unix_seconds("to", q.to, ApiError::bad_request)?
        .unwrap_or_else(|| s.clock.now().plus(Duration::from_secs(1)));
    let from = unix_seconds("from", q.from, ApiError::bad_request)?
        .unwrap_or_else(|| to.minus(Duration::from_secs(24 * 3600)));
    let rows = s
        .store
        .usage_query(&account, TimeRange { from, to })
        .await?;
    let items = rows.iter().map(UsageView::from).collect();
    ok(StatusCode::OK, UsageList { items })
}

/// The account's operational alerts, newest first.
#[utoipa::path(
    get,
    path = "/v1/accounts/{account}/alerts",
    tag = "alerts",
    params(AccountPath, PageQuery),
    responses((status = 200, description = "One page of alerts", body = Listing<AlertView>)),
)]
pub(crate) async fn alerts(
    State(s): Shared,
    Scope(account): Scope,
    Query(q): Query<PageQuery>,
) -> Answer {
    let p = s.store.alert_list(&account, q.request()?).await?;
    ok(StatusCode::OK, Listing::<AlertView>::of(&p))
}
