//! Tests of script contracts, arguments and reply parsing.

use super::oracle::{parse_check_reply, parse_group_reply, parse_reply, ScriptCalls};
use super::*;
use crate::limit::{Key, TokenBucket};
use crate::store::StoreCheck;

#[test]
fn every_script_documents_its_contract() {
    for source in [TOKEN_BUCKET, SLIDING_LOG, FIXED_WINDOW, BATCH] {
        for part in [
            "KEYS[",
            "ARGV[1]",
            "returns",
            "now_us",
            "TESTS ONLY",
            "TTL",
            "Why",
        ] {
            assert!(source.contains(part), "missing {part}");
        }
        let mut code = source.lines().filter(|l| !l.trim_start().starts_with("--"));
        assert!(
            code.all(|line| !line.contains("tostring(")),
            "tostring prints 14 significant digits; times have 16"
        );
    }
    for source in [TOKEN_BUCKET, SLIDING_LOG, FIXED_WINDOW] {
        let functions = functions(source);
        assert!(source.contains(ENTRY_MARKER));
        assert!(
            !functions.contains("KEYS[")
                || functions
                    .lines()
                    .all(|l| l.trim_start().starts_with("--") || !l.contains("KEYS["))
        );
    }
    assert_eq!(Scripts::default().batch.sha.len(), 40);
}

#[test]
fn arguments_follow_the_script_headers() {
    let bucket = Algorithm::TokenBucket(TokenBucket::new(1000, 60_000_000, 150).expect("valid"));
    let scripts = Scripts::default();
    let call = scripts.call(&bucket, "k".into(), 2, Spend::Record, None);
    let text = |args: &[Vec<u8>]| {
        args.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(text(&call.args), ["1000", "60000000", "150", "2", "1"]);
    let call = scripts.call(&bucket, "k".into(), 2, Spend::DryRun, Some(7));
    assert_eq!(text(&call.args), ["1000", "60000000", "150", "2", "0", "7"]);
    let check = StoreCheck {
        key: Key::new(Arc::from("p"), ["x"]),
        algorithm: bucket,
        cost: 3,
        enforce: false,
        generation: 0,
    };
    let call = scripts.group_call(&[("k".into(), &check)], Spend::Record, Some(9));
    // now, then packed (an array32 of 10 integers): one check of one item (committed): key 1,
    // token bucket, shadow, cost 3, quota, most_ahead (no debt bound: 2^52).
    assert_eq!(call.args[0], b"9");
    let mut packed = vec![0xdd, 0, 0, 0, 10, 1, 1, 1, 1, 0, 3, 0xcd, 0x03, 0xe8, 0xce];
    packed.extend_from_slice(&60_000_000u32.to_be_bytes());
    packed.extend_from_slice(&[0xcc, 150, 0xcf]);
    packed.extend_from_slice(&(1u64 << 52).to_be_bytes());
    assert_eq!(call.args[1], packed);
    // With a debt bound of 2 periods: 60e6 * (150 - 1 + 2 * 1000) units.
    let check = StoreCheck {
        algorithm: bucket.with_report_debt(2),
        ..check
    };
    let call = scripts.group_call(&[("k".into(), &check)], Spend::Record, Some(9));
    let most = 60_000_000u64 * (149 + 2000);
    assert!(u32::try_from(most).is_err());
    assert!(call.args[1].ends_with(&[&[0xcf][..], &most.to_be_bytes()].concat()));
}

#[test]
fn replies_parse_and_never_maps_from_minus_one() {
    let reply = Value::Array([0, 10, 0, 5, -1].map(Value::Int).to_vec());
    let decision = parse_reply(&reply).expect("parses");
    assert!(!decision.allowed);
    assert_eq!(decision.retry_after_us, NEVER);
    assert!(parse_reply(&Value::Int(1)).is_err());
    let Value::Array(figures) = &reply else {
        unreachable!()
    };
    let check = Value::Array([figures.clone(), figures.clone()].concat());
    assert_eq!(parse_check_reply(&check, 2).expect("parses").len(), 2);
    assert!(parse_check_reply(&check, 3).is_err());
    assert_eq!(parse_group_reply(&check, 2).expect("parses").len(), 2);
    assert!(parse_group_reply(&check, 3).is_err());
}

#[test]
fn a_flat_batch_reply_splits_by_each_checks_items() {
    let figures = |allowed: i64| [allowed, 10, 3, 5, 0].map(Value::Int).to_vec();
    let error = match redis::parse_redis_value(b"-BADSTATE not sluice's [item 1]\r\n") {
        Ok(Value::ServerError(error)) => error,
        other => panic!("not an error reply: {other:?}"),
    };
    // Checks of 2 items, 1 item (failed), 1 item.
    let flat = [
        figures(1),
        figures(0),
        vec![Value::ServerError(error)],
        figures(1),
    ]
    .concat();
    let parts = split_batch_reply(&flat, [2, 1, 1]).expect("splits");
    assert_eq!(parts.len(), 3);
    let first = parse_figures(parts[0].expect("figures")).expect("parses");
    assert_eq!((first[0].allowed, first[1].allowed), (true, false));
    assert_eq!(parts[1].expect_err("the error").code(), "BADSTATE");
    assert!(parse_figures(parts[2].expect("figures")).expect("parses")[0].allowed);
    // Too few values, or values left over, is no reply of these checks.
    assert!(split_batch_reply(&flat, [2, 1, 2]).is_err());
    assert!(split_batch_reply(&flat, [2, 1]).is_err());
}
