//! Issue 75, in process over the embedded store: every state says why
//! (listings, the delivery page, the overview's counts), the endpoint page
//! with its links and actions, filters and lookups, the bulk replay's
//! confirmation, and error pages that keep the account's navigation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use axum::http::StatusCode;
use control_plane_core::{
    AttemptReport, ClaimRequest, Clock, DeliveryOutcome, SystemClock, Timestamp,
};
use serde_json::{json, Value};

#[path = "../../api/tests/support/mod.rs"]
mod support;
use support::{call, csrf_of, sign_in, ui, Api, ADMIN};

async fn api() -> Api {
    support::api_with(dashboard::router()).await
}

/// An endpoint of acme receiving `types`.
async fn endpoint(api: &Api, path: &str, types: &[&str]) -> String {
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(
            json!({"url": format!("https://example.com/{path}"), "event_types": types,
                     "description": path}),
        )
        .send(api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// Publishes an event of `event_type`; its deliveries' ids.
async fn publish(api: &Api, event_type: &str) -> (String, Vec<String>) {
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .json(json!({"type": event_type, "payload": {"n": 1}}))
        .send(api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let ids = v["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    (v["id"].as_str().unwrap().to_string(), ids)
}

/// Claims what is due and records `outcome(now)` for each.
async fn fail_all(api: &Api, outcome: impl Fn(Timestamp) -> DeliveryOutcome) -> usize {
    let claimed = api
        .store
        .delivery_claim(ClaimRequest::new("w", 100, Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    for c in &claimed {
        api.store
            .delivery_record_outcome(&c.lease, outcome(SystemClock.now()))
            .await
            .unwrap();
    }
    claimed.len()
}

fn report() -> AttemptReport {
    AttemptReport {
        status_code: Some(503),
        error: Some("HTTP 503".into()),
        latency_ms: 12,
        response_body: Some("<b>busy, come back later</b>".into()),
    }
}

async fn get(api: &Api, cookie: &str, path: &str) -> (StatusCode, String) {
    let (s, _, page) = ui(api, "GET", path, Some(cookie), None).await;
    (s, page)
}

/// A disabled endpoint, an open circuit and a backoff each hold their
/// deliveries, and every page that shows such a delivery says which; the
/// overview counts the held ones.
#[tokio::test]
async fn every_held_delivery_says_why_in_listings_its_page_and_the_counts() {
    let api = api().await;
    let paused = endpoint(&api, "paused", &["order.paid"]).await;
    let failing = endpoint(&api, "failing", &["order.failed"]).await;
    let slow = endpoint(&api, "slow", &["order.slow"]).await;
    let (_, paused_deliveries) = publish(&api, "order.paid").await;
    publish(&api, "order.paid").await;
    let (s, v) = call(
        "POST",
        format!("/v1/accounts/acme/endpoints/{paused}/disable"),
    )
    .json(json!({"reason": "maintenance <window>"}))
    .send(&api)
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Five failures in a row open the failing endpoint's circuit.
    let (_, failing_deliveries) = publish(&api, "order.failed").await;
    for _ in 0..5 {
        let n = fail_all(&api, |now| DeliveryOutcome::Retry {
            at: now,
            report: report(),
        })
        .await;
        assert_eq!(n, 1);
    }
    // The slow one backs off for an hour.
    let (_, slow_deliveries) = publish(&api, "order.slow").await;
    fail_all(&api, |now| DeliveryOutcome::Retry {
        at: now.plus(Duration::from_secs(3600)),
        report: report(),
    })
    .await;

    let cookie = sign_in(&api, ADMIN).await;
    let (s, page) = get(&api, &cookie, "/ui/a/acme/deliveries").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("endpoint disabled: maintenance &lt;window&gt;"),
        "{page}"
    );
    assert!(page.contains("circuit open: next probe"), "{page}");
    assert!(page.contains("backing off after attempt 1 of 8"), "{page}");
    assert!(
        page.contains("<span class=\"st st-held\">held</span>"),
        "held is styled and said: {page}"
    );
    assert!(
        page.contains("in 60 min") || page.contains("in 59 min"),
        "{page}"
    );

    let (_, page) = get(
        &api,
        &cookie,
        &format!("/ui/a/acme/deliveries/{}", paused_deliveries[0]),
    )
    .await;
    let state = page.split("id=\"fact-state\">").nth(1).unwrap();
    assert!(
        state.starts_with("<span class=\"st st-held\">held</span>")
            && state.contains("endpoint disabled"),
        "{page}"
    );
    let (_, page) = get(
        &api,
        &cookie,
        &format!("/ui/a/acme/deliveries/{}", failing_deliveries[0]),
    )
    .await;
    assert!(page.contains("circuit open: next probe"), "{page}");
    let (_, page) = get(
        &api,
        &cookie,
        &format!("/ui/a/acme/deliveries/{}", slow_deliveries[0]),
    )
    .await;
    assert!(
        page.contains("<span class=\"st st-wait\">backing off</span>"),
        "{page}"
    );

    // The overview: 3 held (2 behind the disabled endpoint, 1 behind the
    // circuit), each row of the circuits and disabled tables with its own.
    let (_, page) = get(&api, &cookie, "/ui/a/acme").await;
    assert!(page.contains("id=\"count-held\">3<"), "{page}");
    assert!(
        page.contains("id=\"failed-per-minute\">6<"),
        "failures count per minute too: {page}"
    );
    assert!(page.contains("2 held") && page.contains("1 held"), "{page}");
    assert!(
        page.contains(&format!("/ui/a/acme/endpoints/{failing}")),
        "{page}"
    );
    // The endpoints list says the circuit is open, not just "enabled".
    let (_, page) = get(&api, &cookie, "/ui/a/acme/endpoints").await;
    assert!(
        page.contains("<span class=\"st st-held\">circuit open</span>"),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"st st-bad\">disabled</span>"),
        "{page}"
    );
    assert!(page.contains(&format!("id=\"enable-{paused}\"")), "{page}");
    assert!(page.contains(&format!("id=\"disable-{slow}\"")), "{page}");
}

/// The endpoint page: settings, health, counts, failures with the
/// receiver's answer (escaped), links both ways, and its actions.
#[tokio::test]
async fn the_endpoint_page_links_both_ways_and_its_actions_work() {
    let api = api().await;
    let id = endpoint(&api, "hook", &["order.paid"]).await;
    let (event, deliveries) = publish(&api, "order.paid").await;
    fail_all(&api, |now| DeliveryOutcome::Retry {
        at: now,
        report: report(),
    })
    .await;
    let cookie = sign_in(&api, ADMIN).await;
    let href = format!("/ui/a/acme/endpoints/{id}");

    let (_, list) = get(&api, &cookie, "/ui/a/acme/endpoints").await;
    assert!(list.contains(&format!("href=\"{href}\"")), "{list}");
    let (s, page) = get(&api, &cookie, &href).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("<code>{id}</code>")), "{page}");
    assert!(page.contains("order.paid"), "{page}");
    assert!(
        page.contains("&lt;b&gt;busy, come back later&lt;/b&gt;"),
        "the receiver's answer, escaped: {page}"
    );
    assert!(!page.contains("<b>busy"), "{page}");
    for link in [
        format!("/ui/a/acme/deliveries?endpoint={id}"),
        format!("/ui/a/acme/attempts?endpoint={id}"),
        format!("/ui/a/acme/deliveries/{}", deliveries[0]),
    ] {
        assert!(page.contains(&format!("href=\"{link}\"")), "{link}: {page}");
    }
    assert!(page.contains("id=\"count-pending\">1<"), "{page}");

    // The delivery links to its endpoint and event; the event's deliveries
    // and the endpoint's deliveries list it, each filter shown as active.
    let (_, page) = get(
        &api,
        &cookie,
        &format!("/ui/a/acme/deliveries/{}", deliveries[0]),
    )
    .await;
    assert!(page.contains(&format!("href=\"{href}\"")), "{page}");
    assert!(
        page.contains(&format!("href=\"/ui/a/acme/deliveries?event={event}\"")),
        "{page}"
    );
    for filter in [format!("event={event}"), format!("endpoint={id}")] {
        let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries?{filter}")).await;
        assert!(page.contains(&deliveries[0]), "{filter}: {page}");
        assert!(page.contains("id=\"active-filters\""), "{filter}: {page}");
    }
    let (_, page) = get(&api, &cookie, "/ui/a/acme/deliveries?state=dead").await;
    assert!(
        page.contains("No delivery.") && page.contains("class=\"active\">dead<"),
        "{page}"
    );

    // Actions: disable with a reason, enable, rotate the secret.
    let csrf = csrf_of(&page);
    let post = |path: String, form: String| {
        let (api, cookie) = (&api, cookie.clone());
        async move { ui(api, "POST", &path, Some(&cookie), Some(form)).await }
    };
    let (s, h, _) = post(
        format!("{href}/disable"),
        format!("csrf={csrf}&reason=receiver+moved"),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(h["location"].to_str().unwrap().ends_with("?done=disabled"));
    let (_, v) = call("GET", format!("/v1/accounts/acme/endpoints/{id}"))
        .send(&api)
        .await;
    assert_eq!(
        (v["enabled"].clone(), v["disabled_reason"].clone()),
        (json!(false), json!("receiver moved")),
        "{v}"
    );
    let (s, _, _) = post(format!("{href}/enable"), format!("csrf={csrf}")).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (_, v) = call("GET", format!("/v1/accounts/acme/endpoints/{id}"))
        .send(&api)
        .await;
    assert_eq!(v["enabled"], json!(true), "{v}");
    let (s, _, page) = post(format!("{href}/rotate-secret"), format!("csrf={csrf}")).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let secret = page
        .split("id=\"new-secret\">")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .unwrap();
    assert!(secret.starts_with("whsec_"), "{page}");
    let (_, again) = get(&api, &cookie, &href).await;
    assert!(!again.contains(secret), "the secret is shown once");

    // Send an example of a type it takes, from its page.
    let (s, v) = call("PUT", "/v1/accounts/acme/event-types/order.paid")
        .json(json!({"description": "paid", "example": {"n": 42}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, page) = get(&api, &cookie, &href).await;
    assert!(page.contains("id=\"send-example\""), "{page}");
    let (s, h, _) = post(
        format!("{href}/send-example"),
        format!("csrf={csrf}&type=order.paid"),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let to = h["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/ui/a/acme/deliveries/"), "{to}");
    let (_, page) = get(&api, &cookie, &to).await;
    assert!(
        page.contains("{&quot;n&quot;:42}") || page.contains("\"n\":42"),
        "{page}"
    );
}

/// Lookups lead to what they name; bad input and unknown accounts lead to
/// pages that say so and keep the account's navigation; the overview
/// reloads itself only when asked.
#[tokio::test]
async fn lookups_bad_input_and_unknown_accounts_lead_somewhere() {
    let api = api().await;
    endpoint(&api, "hook", &["order.paid"]).await;
    let (event, deliveries) = publish(&api, "order.paid").await;
    let cookie = sign_in(&api, ADMIN).await;
    let (s, h, _) = ui(
        &api,
        "GET",
        &format!("/ui/a/acme/deliveries?q={}", deliveries[0]),
        Some(&cookie),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert_eq!(
        h["location"],
        format!("/ui/a/acme/deliveries/{}", deliveries[0]).as_str()
    );
    let (_, h, _) = ui(
        &api,
        "GET",
        &format!("/ui/a/acme/deliveries?q={event}"),
        Some(&cookie),
        None,
    )
    .await;
    assert_eq!(
        h["location"],
        format!("/ui/a/acme/deliveries?event={event}").as_str()
    );
    let (s, v) = call("POST", "/v1/accounts/acme/events")
        .header("idempotency-key", "order-77")
        .json(json!({"type": "order.paid", "payload": {"n": 2}}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (_, h, _) = ui(
        &api,
        "GET",
        "/ui/a/acme/deliveries?q=order-77",
        Some(&cookie),
        None,
    )
    .await;
    assert_eq!(
        h["location"],
        format!("/ui/a/acme/deliveries?event={}", v["id"].as_str().unwrap()).as_str(),
        "an idempotency key leads to its event's deliveries"
    );
    let (s, page) = get(&api, &cookie, "/ui/a/acme/deliveries?q=nothing-like-it").await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("id=\"not-found\""), "{page}");

    for bad in [
        "/ui/a/acme/deliveries?state=sent",
        "/ui/a/acme/deliveries?endpoint=nope",
        "/ui/a/acme/deliveries?cursor=x",
        "/ui/a/acme/endpoints/not-an-id",
        "/ui/a/acme/no-such-page",
        "/ui/a/acme?refresh=1",
        "/ui/a/acme/attempts?within=5",
    ] {
        let (s, page) = get(&api, &cookie, bad).await;
        assert!(s.is_client_error(), "{bad}: {s}");
        assert!(page.contains("id=\"error\""), "{bad}: {page}");
        assert!(
            page.contains("href=\"/ui/a/acme/endpoints\"") && page.contains("id=\"back\""),
            "{bad}: the page keeps the account's navigation: {page}"
        );
    }
    let (s, page) = get(&api, &cookie, "/ui/a/acme/attempts?within=24").await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("<option value=\"24\" selected>"), "{page}");
    let (s, page) = get(&api, &cookie, "/ui/a/acmee").await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("id=\"unknown-account\""), "{page}");
    let (_, page) = get(&api, &cookie, "/ui/a/acme").await;
    assert!(
        !page.contains("unknown-account") && !page.contains("http-equiv"),
        "{page}"
    );
    let (_, page) = get(&api, &cookie, "/ui/a/acme?refresh=30").await;
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"30\">"),
        "{page}"
    );
}

/// The bulk replay first says what it will do and replays nothing; the
/// confirmed form replays exactly that.
#[tokio::test]
async fn a_bulk_replay_says_what_it_will_do_and_asks_once_more() {
    let api = api().await;
    let a = endpoint(&api, "a", &["order.paid"]).await;
    endpoint(&api, "b", &["order.paid", "order.other"]).await;
    publish(&api, "order.paid").await;
    publish(&api, "order.other").await;
    let died = fail_all(&api, |_| DeliveryOutcome::GiveUp(report())).await;
    assert_eq!(died, 3);
    let cookie = sign_in(&api, ADMIN).await;
    let (_, page) = get(&api, &cookie, "/ui/a/acme/dead").await;
    let csrf = csrf_of(&page);
    let dead = || async {
        let (_, v): (StatusCode, Value) = call("GET", "/v1/accounts/acme/deliveries?state=dead")
            .send(&api)
            .await;
        v["items"].as_array().unwrap().len()
    };
    let (s, _, page) = ui(
        &api,
        "POST",
        "/ui/a/acme/dead/replay",
        Some(&cookie),
        Some(format!("csrf={csrf}&endpoint_id=&within_hours=")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(
        page.contains("Replay 3 dead deliveries of 2 endpoints"),
        "{page}"
    );
    assert!(page.contains("id=\"confirm-replay\""), "{page}");
    assert_eq!(dead().await, 3, "nothing replayed before the confirmation");
    let (_, _, page) = ui(
        &api,
        "POST",
        "/ui/a/acme/dead/replay",
        Some(&cookie),
        Some(format!("csrf={csrf}&endpoint_id={a}&within_hours=24")),
    )
    .await;
    assert!(
        page.contains("Replay 1 dead delivery of 1 endpoint"),
        "{page}"
    );
    let (s, h, _) = ui(
        &api,
        "POST",
        "/ui/a/acme/dead/replay",
        Some(&cookie),
        Some(format!(
            "csrf={csrf}&endpoint_id={a}&within_hours=24&confirm=yes"
        )),
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(h["location"].to_str().unwrap().ends_with("?replayed=1"));
    assert_eq!(dead().await, 2);
}

/// The deliveries page filters by event type and creation time, shows
/// both as active filters, keeps them across the state links, and refuses
/// a time window it does not offer with a page that keeps the navigation.
#[tokio::test]
async fn deliveries_are_filtered_by_event_type_and_time_on_the_page() {
    let api = api().await;
    endpoint(&api, "hook", &[]).await;
    let (_, paid) = publish(&api, "order.paid").await;
    let (_, refunded) = publish(&api, "order.refunded").await;
    let cookie = sign_in(&api, ADMIN).await;
    let (s, page) = get(&api, &cookie, "/ui/a/acme/deliveries?type=order.paid").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains(&paid[0]), "{page}");
    assert!(!page.contains(&refunded[0]), "{page}");
    assert!(
        page.contains("id=\"active-filters\"") && page.contains("<strong title=\"order.paid\">"),
        "{page}"
    );
    assert!(
        page.contains("href=\"/ui/a/acme/deliveries?state=pending&amp;type=order.paid\""),
        "the state links keep the type: {page}"
    );
    assert!(
        page.contains("id=\"f-type\" name=\"type\" value=\"order.paid\""),
        "{page}"
    );
    let (_, page) = get(&api, &cookie, "/ui/a/acme/deliveries?within=1").await;
    assert!(
        page.contains(&paid[0]) && page.contains(&refunded[0]),
        "{page}"
    );
    assert!(page.contains("option value=\"1\" selected"), "{page}");
    let (_, page) = get(
        &api,
        &cookie,
        "/ui/a/acme/deliveries?within=1&type=nothing.here",
    )
    .await;
    assert!(page.contains("No delivery."), "{page}");
    let (s, page) = get(&api, &cookie, "/ui/a/acme/deliveries?within=5").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{page}");
    assert!(
        page.contains("within: expected 1, 24 or 168 hours"),
        "{page}"
    );
    assert!(
        page.contains("href=\"/ui/a/acme/deliveries\""),
        "navigation kept: {page}"
    );
}

/// Absolute times are written in the zone the viewer names at the foot of
/// a page (UTC until then); an unknown name is refused with a page that
/// says so, and the form never leads off the dashboard.
#[tokio::test]
async fn times_are_shown_in_the_zone_the_viewer_names() {
    let api = api().await;
    endpoint(&api, "hook", &[]).await;
    let (_, ids) = publish(&api, "order.paid").await;
    let cookie = sign_in(&api, ADMIN).await;
    let path = format!("/ui/a/acme/deliveries/{}", ids[0]);
    let (_, page) = get(&api, &cookie, &path).await;
    assert!(page.contains("Z</small>"), "UTC by default: {page}");
    assert!(
        page.contains("id=\"zone-name\" name=\"zone\" value=\"UTC\""),
        "{page}"
    );
    let csrf = csrf_of(&page);
    let set = |zone: &str, back: &str| {
        let form = format!("csrf={csrf}&zone={zone}&back={back}");
        let (api, cookie) = (&api, cookie.clone());
        async move { ui(api, "POST", "/ui/zone", Some(&cookie), Some(form)).await }
    };
    // Kolkata: UTC+05:30 the whole year, named IST.
    let (s, h, body) = set("Asia%2FKolkata", &path.replace('/', "%2F")).await;
    assert_eq!(s, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(h["location"], path.as_str());
    let zone = h["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(zone, "cp_zone=Asia%2FKolkata");
    let both = format!("{cookie}; {zone}");
    let (_, page) = get(&api, &both, &path).await;
    assert!(
        page.contains(" IST</small>") && !page.contains("Z</small>"),
        "{page}"
    );
    assert!(page.contains("value=\"Asia/Kolkata\""), "{page}");
    // The same instant, 5 h 30 min apart on the two pages.
    let shown = |page: &str| {
        let at = page.split("<small class=\"abs\">").nth(1).unwrap();
        at[11..16].to_string()
    };
    let (_, utc) = get(&api, &cookie, &path).await;
    let minutes =
        |hhmm: &str| hhmm[..2].parse::<i32>().unwrap() * 60 + hhmm[3..].parse::<i32>().unwrap();
    let apart = (minutes(&shown(&page)) - minutes(&shown(&utc))).rem_euclid(24 * 60);
    assert_eq!(apart, 330, "{} against {}", shown(&page), shown(&utc));
    // Unknown names are refused; the form only leads back into /ui.
    let (s, _, body) = set("Mars%2FOlympus", "%2Fui").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("not a name of the time zone database"),
        "{body}"
    );
    let (s, h, _) = set("UTC", "%2F%2Fevil.example%2Fx").await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert_eq!(h["location"], "/ui");
    // Without a session (an anonymous client, another site's form) nothing
    // is kept either.
    let form = "csrf=x&zone=UTC&back=%2Fui".to_string();
    let (s, h, _) = ui(&api, "POST", "/ui/zone", None, Some(form)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert_eq!(h["location"], "/ui/login", "sent to sign in");
    assert!(h.get("set-cookie").is_none());
    // Without the session's CSRF token nothing is kept.
    let form = "csrf=nope&zone=UTC&back=%2Fui".to_string();
    let (s, h, _) = ui(&api, "POST", "/ui/zone", Some(&cookie), Some(form)).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(h.get("set-cookie").is_none());
}

/// An endpoint's jq program is refused at save when it does not compile,
/// with where, and once saved the endpoint page shows it as text.
#[tokio::test]
async fn the_endpoint_page_shows_its_transformation() {
    let api = api().await;
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/t", "transform": "{id: .data.id"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("transform: 1:"), "{message}");
    let program = "if .data.n < 3 then {n: .data.n} else null end";
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"url": "https://example.com/t", "transform": program}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["transform"], program);
    let id = v["id"].as_str().unwrap().to_string();
    let cookie = sign_in(&api, ADMIN).await;
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/endpoints/{id}")).await;
    assert!(
        page.contains("<pre>if .data.n &lt; 3 then {n: .data.n} else null end</pre>"),
        "{page}"
    );
    // A delivery's page says its body is rewritten, and by what.
    let (_, ids) = publish(&api, "order.paid").await;
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries/{}", ids[0])).await;
    assert!(
        page.contains("id=\"transformed\"") && page.contains("else null end</code>"),
        "{page}"
    );
    let (s, v) = call("PATCH", format!("/v1/accounts/acme/endpoints/{id}"))
        .json(json!({"transform": null}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["transform"].is_null(), "{v}");
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/endpoints/{id}")).await;
    assert!(
        page.contains("none: bodies are sent as published"),
        "{page}"
    );
}

#[tokio::test]
async fn a_poll_endpoint_says_its_consumer_reads_it_and_its_deliveries_wait_for_that() {
    let api = api().await;
    let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
        .json(json!({"kind": "poll"}))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (_, ids) = publish(&api, "order.paid").await;
    let cookie = sign_in(&api, ADMIN).await;
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/endpoints/{id}")).await;
    assert!(
        page.contains("id=\"fact-kind\"") && page.contains("(poll endpoint)"),
        "{page}"
    );
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries/{}", ids[0])).await;
    assert!(
        page.contains("waiting for its consumer to read it"),
        "{page}"
    );
    let (s, read) = call("GET", format!("/v1/accounts/acme/endpoints/{id}/poll"))
        .send(&api)
        .await;
    assert_eq!(s, StatusCode::OK, "{read}");
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries/{}", ids[0])).await;
    assert!(!page.contains("waiting for its consumer"), "{page}");
    assert!(page.contains("delivered"), "{page}");
}

/// The reasons the other tests leave out (an ordered endpoint's queue, the
/// in-flight cap), the endpoints page's pending and dead counts, and the
/// deliveries page's pager followed both ways.
#[tokio::test]
async fn the_cap_and_order_reasons_the_counts_and_the_pager_show_over_http() {
    let api = api().await;
    let create = |body: Value| {
        let api = &api;
        async move {
            let (s, v) = call("POST", "/v1/accounts/acme/endpoints")
                .json(body)
                .send(api)
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
            v["id"].as_str().unwrap().to_string()
        }
    };
    create(json!({"url": "https://example.com/o", "event_types": ["o.x"], "ordered": true})).await;
    let capped =
        create(json!({"url": "https://example.com/c", "event_types": ["c.x"], "max_in_flight": 1}))
            .await;
    let (_, o1) = publish(&api, "o.x").await;
    let (_, o2) = publish(&api, "o.x").await;
    let (_, c1) = publish(&api, "c.x").await;
    let (_, c2) = publish(&api, "c.x").await;
    let claimed = api
        .store
        .delivery_claim(ClaimRequest::new("w", 100, Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    let ids: Vec<String> = claimed.iter().map(|c| c.delivery.id.to_string()).collect();
    assert_eq!(ids.len(), 2, "the ordered head and one capped: {ids:?}");
    assert!(ids.contains(&o1[0]) && !ids.contains(&o2[0]), "{ids:?}");
    let waiting = if ids.contains(&c1[0]) { &c2[0] } else { &c1[0] };
    let cookie = sign_in(&api, ADMIN).await;
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries/{}", o2[0])).await;
    assert!(
        page.contains("ordered endpoint: waiting for the delivery in flight"),
        "{page}"
    );
    let (_, page) = get(&api, &cookie, &format!("/ui/a/acme/deliveries/{waiting}")).await;
    assert!(
        page.contains("in-flight cap reached (1 of 1 in flight)"),
        "{page}"
    );
    // The capped endpoint's leased delivery dies: 1 pending, 1 dead.
    let lease = &claimed
        .iter()
        .find(|c| c.delivery.endpoint_id.to_string() == capped)
        .unwrap()
        .lease;
    api.store
        .delivery_record_outcome(lease, DeliveryOutcome::GiveUp(report()))
        .await
        .unwrap();
    let (_, page) = get(&api, &cookie, "/ui/a/acme/endpoints").await;
    let pending = format!("state=pending&amp;endpoint={capped}\">1</a>");
    let dead = format!("state=dead&amp;endpoint={capped}\" class=\"bad\">1</a>");
    assert!(page.contains(&pending) && page.contains(&dead), "{page}");

    // 4 deliveries so far; 56 more make 60: two pages of 50 and 10.
    for _ in 0..56 {
        publish(&api, "o.x").await;
    }
    let (_, first) = get(&api, &cookie, "/ui/a/acme/deliveries").await;
    assert!(
        first.contains("rows 1–50") && !first.contains("id=\"newer\""),
        "{first}"
    );
    let older = first.split("id=\"next\"").next().unwrap();
    let href = older
        .rsplit("href=\"")
        .next()
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let (_, second) = get(&api, &cookie, &href.replace("&amp;", "&")).await;
    assert!(
        second.contains("rows 51–60") && !second.contains("id=\"next\""),
        "{second}"
    );
    assert!(second.contains("id=\"newer\""), "{second}");
}

/// The alerts page names the endpoint of each alert, and the delivery of
/// a dead one, as links to their pages.
#[tokio::test]
async fn an_alert_links_its_endpoint_and_its_delivery() {
    let api = api().await;
    let failing = endpoint(&api, "failing", &["order.failed"]).await;
    let (_, deliveries) = publish(&api, "order.failed").await;
    // A delivery given up on goes dead, which raises an alert naming it.
    fail_all(&api, |_| DeliveryOutcome::GiveUp(report())).await;
    let cookie = sign_in(&api, ADMIN).await;
    let (s, page) = get(&api, &cookie, "/ui/a/acme/alerts").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("delivery.dead"), "{page}");
    assert!(
        page.contains(&format!("href=\"/ui/a/acme/endpoints/{failing}\"")),
        "{page}"
    );
    assert!(
        page.contains(&format!("href=\"/ui/a/acme/deliveries/{}\"", deliveries[0])),
        "{page}"
    );
}
