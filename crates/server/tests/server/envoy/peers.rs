//! The settings that make the service answer as envoyproxy/ratelimit or
//! Limitador answer (`docs/envoy.md`, "Settings"), in both stores: what a
//! descriptor over its limit, an `unlimited` one and global shadow mode
//! say; `unknown_domain`, `match: whole`, `record: every_hit`, the three
//! header styles, `replaces`, week units, and a domain of Limitador's
//! `limits:` (conditions on any descriptor, `!=`, no statuses).

use super::*;

const PEERS: &str = r#"
resources: []
envoy:
  headers: ratelimit
  domains:
    - domain: edge
      descriptors:
        - key: user
          rate_limit: { unit: day, requests_per_unit: 2 }
        - key: plan
          name: plan
          rate_limit: { unit: week, requests_per_unit: 5 }
        - key: vip
          name: vip
          replaces: [plan]
          rate_limit: { unit: day, requests_per_unit: 100 }
        - key: health
          unlimited: true
        - key: path
          value: "/files/*"
          rate_limit: { unit: hour, requests_per_unit: 1 }
        - key: a
          descriptors:
            - key: b
              rate_limit: { unit: day, requests_per_unit: 1 }
        - key: quota
          quota_mode: true
          rate_limit: { unit: day, requests_per_unit: 1 }
"#;

fn with(extra: &str) -> String {
    PEERS.replacen("envoy:\n", &format!("envoy:\n{extra}"), 1)
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_say_what_both_peers_say() {
    for store in STORES {
        let (s, _redis) = server(PEERS, store).await;
        let mut c = client(&s).await;
        // Over the limit: limit_remaining 0, whatever is left after the
        // refusal (2 of 2 were left, 3 asked for).
        let st = one(&mut c, &[("user", "ann")], Some(3)).await;
        assert!(over(&st) && st.limit_remaining == 0, "{store}: {st:?}");
        // Within: what is left after the hit; the reset in whole seconds.
        let st = one(&mut c, &[("user", "ann")], None).await;
        assert!(ok(&st) && st.limit_remaining == 1, "{store}: {st:?}");
        let reset = st.duration_until_reset.expect("a reset");
        assert!(
            reset.nanos == 0 && (1..=86_400).contains(&reset.seconds),
            "{reset:?}"
        );
        // Unlimited: u32's largest.
        let st = one(&mut c, &[("health", "x")], None).await;
        assert_eq!((st.code, st.limit_remaining), (Code::Ok as i32, u32::MAX));
        // A week is a unit of its own.
        let st = one(&mut c, &[("plan", "p")], None).await;
        let limit = st.current_limit.expect("a limit");
        assert_eq!(
            (limit.unit, limit.name.as_str()),
            (Unit::Week as i32, "plan")
        );
        // envoyproxy/ratelimit's headers: no Retry-After.
        let r = call(
            &mut c,
            request(vec![descriptor(&[("user", "ann")], Some(5))]),
        )
        .await;
        let h = headers(&r);
        let keys: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
        );
        assert_eq!((h[0].1.as_str(), h[1].1.as_str()), ("2", "0"), "{store}");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_names_rename_the_styles_headers() {
    let names = "  header_names: { limit: X-Quota, reset: x-quota-reset }\n";
    let (s, _redis) = server(&with(names), STORES[0]).await;
    let mut c = client(&s).await;
    let r = call(&mut c, request(vec![descriptor(&[("user", "ann")], None)])).await;
    let keys: Vec<String> = headers(&r).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["X-Quota", "RateLimit-Remaining", "x-quota-reset"]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_wildcards_quota_and_whole_matching() {
    for store in STORES {
        let (s, _redis) = server(&with("  match: whole\n"), store).await;
        let mut c = client(&s).await;
        // vip replaces plan in the same call: plan's status is OK, no limit,
        // and plan records nothing.
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("plan", "p")], Some(5)),
                descriptor(&[("vip", "v")], None),
            ]),
        )
        .await;
        assert!(r.statuses[0].current_limit.is_none(), "{store}: {r:?}");
        assert_eq!(r.overall_code, Code::Ok as i32);
        let st = one(&mut c, &[("plan", "p")], Some(5)).await;
        assert!(ok(&st), "{store}: replaced, plan recorded nothing: {st:?}");
        // A wildcard: each value its own count.
        assert!(ok(&one(&mut c, &[("path", "/files/a")], None).await));
        assert!(over(&one(&mut c, &[("path", "/files/a")], None).await));
        assert!(ok(&one(&mut c, &[("path", "/files/b")], None).await));
        // match: whole: a descriptor longer than its path is not limited;
        // one that ends on a node without a limit neither.
        for d in [&[("user", "u"), ("x", "y")][..], &[("a", "1")]] {
            let st = one(&mut c, d, Some(100)).await;
            assert!(
                ok(&st) && st.current_limit.is_none(),
                "{store}: {d:?}: {st:?}"
            );
        }
        assert!(ok(&one(&mut c, &[("a", "1"), ("b", "2")], None).await));
        // quota_mode: the call is over when every quota descriptor is over
        // (one alone, here), not while another still has quota.
        assert!(ok(&one(&mut c, &[("quota", "q")], None).await));
        let r = call(&mut c, request(vec![descriptor(&[("quota", "q")], None)])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}");
        let r = call(
            &mut c,
            request(vec![
                descriptor(&[("quota", "q")], None),
                descriptor(&[("quota", "r")], None),
            ]),
        )
        .await;
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{store}: {r:?}");
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_unknown_domains_and_every_hit() {
    for store in STORES {
        // Global shadow mode keeps each status and answers OK.
        let (s, _redis) = server(&with("  shadow_mode: true\n"), store).await;
        let mut c = client(&s).await;
        let r = call(
            &mut c,
            request(vec![descriptor(&[("user", "ann")], Some(3))]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{store}: {r:?}");
        assert_eq!(r.statuses[0].limit_remaining, 0);
        s.stop().await;

        // unknown_domain: error.
        let (s, _redis) = server(&with("  unknown_domain: error\n"), store).await;
        let mut c = client(&s).await;
        let mut r = request(vec![descriptor(&[("user", "ann")], None)]);
        r.domain = "nowhere".to_owned();
        let e = c.should_rate_limit(r).await.expect_err("unknown");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let metrics = charon_testkit::http_get(s.http.port(), "/metrics")
            .expect("metrics")
            .1;
        assert!(
            metrics.contains("charon_envoy_unknown_domain_total{answer=\"error\"}"),
            "{store}"
        );
        s.stop().await;

        // record: every_hit counts hits over the limit: 3 asked of 2 is
        // over and counted, so one more is over too; all or nothing (the
        // default) counted nothing.
        for (record, then_ok) in [("every_hit", false), ("all_or_nothing", true)] {
            let (s, _redis) = server(&with(&format!("  record: {record}\n")), store).await;
            let mut c = client(&s).await;
            assert!(over(&one(&mut c, &[("user", "ann")], Some(3)).await));
            let st = one(&mut c, &[("user", "ann")], None).await;
            assert_eq!(ok(&st), then_ok, "{store}: {record}: {st:?}");
            // Every descriptor is decided alone: one over does not keep the
            // other from being recorded.
            let r = call(
                &mut c,
                request(vec![
                    descriptor(&[("user", "bob")], None),
                    descriptor(&[("user", "cat")], Some(3)),
                ]),
            )
            .await;
            assert_eq!(r.overall_code, Code::OverLimit as i32);
            let st = one(&mut c, &[("user", "bob")], None).await;
            let left = if then_ok { 1 } else { 0 };
            assert_eq!(st.limit_remaining, left, "{store}: {record}: {st:?}");
            s.stop().await;
        }
    }
}

const LIMITADOR: &str = r#"
resources: []
envoy:
  headers: x_ratelimit
  windows: first_hit
  domains:
    - domain: ns
      limits:
        - conditions: [ { key: req.method, equals: GET } ]
          variables: [ { key: app.id } ]
          rate_limit: { window: 60s, requests_per_unit: 2 }
        - name: "no \"json\""
          conditions: [ { key: req.path, not_equals: /json } ]
          rate_limit: { window: 1h, requests_per_unit: 10 }
        - conditions: [ { descriptor: 1, key: kind, equals: deny } ]
          rate_limit: { window: 60s, requests_per_unit: 0 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitador_limits_apply_over_the_whole_call() {
    for store in STORES {
        let (s, _redis) = server(LIMITADOR, store).await;
        let mut c = client(&s).await;
        let get = || {
            let mut r = request(vec![descriptor(
                &[("app.id", "a1"), ("req.path", "/x"), ("req.method", "GET")],
                None,
            )]);
            r.domain = "ns".to_owned();
            r
        };
        let r = call(&mut c, get()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{store}: {r:?}");
        assert!(r.statuses.is_empty(), "Limitador answers no statuses");
        assert_eq!(
            headers(&r),
            [
                (
                    "X-RateLimit-Limit".into(),
                    "2, 2;w=60, 10;w=3600;name=\"no 'json'\"".into()
                ),
                ("X-RateLimit-Remaining".into(), "1".into()),
                ("X-RateLimit-Reset".into(), "60".into()),
            ],
            "{store}"
        );
        assert_eq!(call(&mut c, get()).await.overall_code, Code::Ok as i32);
        let r = call(&mut c, get()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{store}");
        assert_eq!(headers(&r)[1].1, "0");
        // A condition on the second descriptor: a limit of 0.
        let mut r = request(vec![
            descriptor(&[("req.path", "/json")], None),
            descriptor(&[("kind", "deny")], None),
        ]);
        r.domain = "ns".to_owned();
        assert_eq!(call(&mut c, r).await.overall_code, Code::OverLimit as i32);
        s.stop().await;
    }
}
