//! Key names: forms, slots, injectivity, limits.

use super::slot::crc16;
use super::*;
use proptest::prelude::*;

const ROLES: [Role; 6] = [
    Role::Lock,
    Role::QueueDeadlines,
    Role::Queue,
    Role::Notice,
    Role::Idempotency,
    Role::IdempotencyNotice,
];

/// Redis's `keyHashSlot` (cluster.c), written the way Redis does, as a
/// second opinion on [`slot`]: the first `{`, then the first `}` after
/// it; an empty or unterminated tag means the whole name.
fn redis_key_hash_slot(name: &str) -> u16 {
    let key = name.as_bytes();
    let Some(s) = key.iter().position(|b| *b == b'{') else {
        return crc16(key) & 0x3FFF;
    };
    match key[s + 1..].iter().position(|b| *b == b'}') {
        Some(len) if len > 0 => crc16(&key[s + 1..s + 1 + len]) & 0x3FFF,
        _ => crc16(key) & 0x3FFF,
    }
}

/// The tag Redis hashes in `name`, if any.
fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let rest = &name[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// Keys as a caller might write them, heavy in braces and the escape
/// and separator characters.
fn keys() -> impl Strategy<Value = String> {
    prop_oneof![
        "[{}]{1,6}",
        "[{}a:%]{1,12}",
        "[{}%:a-cé ]{1,24}",
        any::<String>(),
    ]
    .prop_filter("a valid key", |k| validate_key(k).is_ok())
}

/// Asserts that the lock, queue, deadlines and notice names of `key`
/// under the prefix `lock:` are the prefix, the role's letter and `tail`.
fn assert_names(key: &str, tail: &str) -> KeyNames {
    let n = KeyNames::new("lock:", key);
    for (name, role) in [
        (n.lock.as_str(), 'L'),
        (n.queue(), 'Q'),
        (&n.deadlines(), 'D'),
        (n.notice(), 'N'),
    ] {
        assert_eq!(name, format!("lock:{role}{tail}"), "{key}");
    }
    n
}

#[test]
fn untagged_keys_are_wrapped_in_a_hash_tag() {
    assert_names("order:42", "{order:42}");
}

#[test]
fn tagged_keys_keep_their_own_tag() {
    let n = KeyNames::new("lock:", "{tenant:7}:order:1");
    assert_eq!(n.lock, "lock:L:{tenant:7}:order:1");
    assert_eq!(n.deadlines(), "lock:D:{tenant:7}:order:1");
    assert_eq!(n.slot, slot("tenant:7"));
}

#[test]
fn untagged_keys_with_braces_elsewhere_keep_the_names_they_had() {
    // These hashed to one slot before the `%{..}` form existed; their
    // names stay, so running deployments keep their locks and counters.
    assert_eq!(name("lock:", Role::Lock, "a}b"), "lock:L{a}b}");
    assert_eq!(name("lock:", Role::Lock, "{}x"), "lock:L{{}x}");
    assert_eq!(name("lock:", Role::Lock, "x{}y"), "lock:L{x{}y}");
    assert_eq!(name("lock:", Role::Lock, "{"), "lock:L{{}");
    assert_eq!(
        name("lock:", Role::QueueDeadlines, "a}b{c}"),
        "lock:D:a}b{c}"
    );
}

#[test]
fn a_key_that_starts_with_a_closing_brace_is_hashed_by_its_escaped_form() {
    let n = assert_names("}x", "%{%7Dx}");
    assert_eq!(n.slot, slot("%7Dx"));
    assert_eq!(name("lock:", Role::Lock, "}}{{"), "lock:L%{%7D%7D%7B%7B}");
    // A tag of its own still wins over the leading `}`.
    assert_eq!(name("lock:", Role::Lock, "}{a}"), "lock:L:}{a}");
}

#[test]
fn a_key_cannot_name_another_keys_counter_or_lock() {
    // Without the body marker these would collide.
    assert_ne!(name("p:", Role::Lock, "a"), name("p:", Role::Lock, "{a}"));
    assert_ne!(
        name("p:", Role::QueueDeadlines, "{t}:a"),
        name("p:", Role::Lock, "{t}:a:fence")
    );
    // The escaped form of `}x` is not the wrapped form of its escape.
    assert_ne!(name("p:", Role::Lock, "}x"), name("p:", Role::Lock, "%7Dx"));
    assert_ne!(
        name("p:", Role::Lock, "}x"),
        name("p:", Role::Lock, "%{%7Dx}")
    );
    for (role, key) in [
        (Role::Lock, "}x"),
        (Role::Lock, "%7Dx"),
        (Role::Queue, "{a}"),
    ] {
        let n = name("p:", role, key);
        assert_eq!(parse("p:", &n), Some((role.letter(), key.to_owned())));
    }
}

#[test]
fn hash_tags_follow_redis_rules() {
    assert!(has_hash_tag("{a}"));
    assert!(has_hash_tag("x{a}y{b}"));
    assert!(has_hash_tag("}{a}"));
    assert!(!has_hash_tag("{}a"));
    assert!(!has_hash_tag("a}b{"));
    assert!(!has_hash_tag("plain"));
    // Redis looks only at the first `}` after the first `{`.
    assert!(!has_hash_tag("{}}"));
}

#[test]
fn slots_match_redis_cluster() {
    // Values from `CLUSTER KEYSLOT` of Redis 7.0.
    assert_eq!(slot("foo"), 12182);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    assert_eq!(slot("123456789"), 0x31C3); // the CRC16 check value
    for (name, keyslot) in [
        ("lock:L{order:42}", 8691),
        ("lock:L:{tenant:7}:order:1", 2624),
        ("lock:L:a}b{c}", 7365),
        ("lock:L{a}b}", 15495),
        ("lock:L{{}}}", 4092),
        ("lock:L{x{}y}", 3596),
        ("lock:I{0123abcd}", 2550),
        ("lock:L%{%7Dx}", 13737),
        ("lock:F%{%7Dx}", 13737),
        ("lock:L%{%7D}", 14708),
        ("lock:N%{%7D%7D%7B%7B}", 9087),
        // The names `}x` had before: an empty tag, one slot per role.
        ("lock:L{}x}", 10964),
        ("lock:F{}x}", 11386),
    ] {
        assert_eq!(slot(name), keyslot, "CLUSTER KEYSLOT {name}");
        assert_eq!(redis_key_hash_slot(name), keyslot, "{name}");
    }
}

#[test]
fn every_name_of_a_key_with_odd_braces_shares_the_slot_of_its_lock() {
    for key in [
        "}", "}x", "}{", "{}", "{}}", "x{}y", "{", "}}{{", "a}b{c}", "}{a}", "%7D",
    ] {
        let n = KeyNames::new("lock:", key);
        for role in ROLES {
            let name = name("lock:", role, key);
            assert!(hash_tag(&name).is_some(), "{name} has a non-empty tag");
            assert_eq!(slot(&name), n.slot, "{name} is in the slot of `{key}`");
        }
    }
}

proptest! {
    #[test]
    fn every_kind_of_name_of_any_key_hashes_to_the_slot_the_key_names_carry(
        prefix in "[a-z:]{0,6}",
        key in keys(),
    ) {
        let n = KeyNames::new(&prefix, &key);
        prop_assert_eq!(n.slot, redis_key_hash_slot(&n.lock));
        for role in ROLES {
            let name = name(&prefix, role, &key);
            // A tag, not a coincidence of whole-name hashes.
            prop_assert!(hash_tag(&name).is_some(), "{} has no tag", name);
            prop_assert_eq!(slot(&name), redis_key_hash_slot(&name));
            prop_assert_eq!(slot(&name), n.slot, "{} vs {}", name, n.lock);
        }
        if has_hash_tag(&key) {
            prop_assert_eq!(hash_tag(&n.lock), hash_tag(&key));
        }
        if !key.contains(['{', '}']) {
            prop_assert_eq!(n.lock, format!("{prefix}L{{{key}}}"));
        }
    }

    #[test]
    fn every_name_reads_back_to_its_own_kind_and_key(
        prefix in "[a-z:%]{0,6}",
        key in keys(),
    ) {
        for role in ROLES {
            let name = name(&prefix, role, &key);
            prop_assert_eq!(parse(&prefix, &name), Some((role.letter(), key.clone())));
        }
    }

    #[test]
    fn slot_agrees_with_the_redis_rule_on_any_string(name in "[{}a-c]{0,10}|\\PC{0,20}") {
        prop_assert_eq!(slot(&name), redis_key_hash_slot(&name));
    }
}

#[test]
fn every_slot_has_a_short_tag_of_its_own() {
    let mut seen = std::collections::HashSet::new();
    for s in 0..16384u16 {
        let tag = slot_tag(s);
        assert!((1..=4).contains(&tag.len()), "slot {s}: {tag:?}");
        assert!(
            tag.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        );
        assert_eq!(slot(tag), s, "{tag}");
        assert!(seen.insert(tag));
    }
    // `CLUSTER KEYSLOT` of two counters, as Redis 7 answered.
    assert_eq!(
        slot_counter("lock:", slot("order:42")),
        format!("lock:S{{{}}}", slot_tag(8691))
    );
    assert_eq!(redis_key_hash_slot(&slot_counter("lock:", 8691)), 8691);
    assert_eq!(redis_key_hash_slot(&slot_counter("p:", 0)), 0);
}

#[test]
fn every_name_of_a_key_shares_its_slot_counter() {
    for key in ["order:42", "{tenant:7}:order:1", "}x", "a}b{c}"] {
        let n = KeyNames::new("lock:", key);
        assert_eq!(slot(&n.fence()), n.slot, "{key}");
        assert_eq!(slot(&n.deadlines()), n.slot, "{key}");
        assert!(n.fence().starts_with("lock:S{"), "{}", n.fence());
    }
}

#[test]
fn bad_keys_are_rejected_with_a_reason() {
    assert!(validate_key("").unwrap_err().is_invalid_key());
    assert!(validate_key(&"x".repeat(MAX_KEY_LEN + 1)).is_err());
    assert!(validate_key("a\nb").is_err());
    assert!(validate_key("ok: {tag} ünïcode").is_ok());
    assert!(validate_prefix("lock{").is_err());
}

/// The CRC16 a bit at a time, as Redis's reference writes it.
fn crc16_bitwise(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

proptest! {
    #[test]
    fn the_table_crc_is_the_bitwise_one(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(crc16(&bytes), crc16_bitwise(&bytes));
    }

    #[test]
    fn each_name_of_a_key_is_made_as_the_lock_name_is(key in keys(), prefix in "[a-z:]{0,6}") {
        for (kind, access) in [
            (LockKind::Mutex, Access::Exclusive),
            (LockKind::RwLock, Access::READ),
            (LockKind::Semaphore, Access::Shared(3)),
            (LockKind::Leader, Access::Exclusive),
        ] {
            let n = KeyNames::of_kind(&prefix, &key, kind, access);
            let letter = |name: &str| name[prefix.len()..].chars().next().unwrap();
            for made in [n.lock.as_str(), n.queue(), n.notice()] {
                let role = ALL_ROLES.iter().find(|r| r.letter() == letter(made)).unwrap();
                prop_assert_eq!(made, name(&prefix, *role, &key));
            }
        }
    }

    #[test]
    fn control_characters_are_refused_whatever_else_the_key_holds(key in "\\PC{0,8}", c in prop_oneof![Just('\u{0}'), Just('\u{1f}'), Just('\u{7f}'), Just('\u{85}'), Just('\u{9f}')]) {
        let with_control = format!("{key}{c}");
        prop_assert!(validate_key(&with_control).is_err());
        prop_assert_eq!(validate_key(&key).is_ok(), !key.is_empty());
    }
}

/// Every role, for the tests that look a name's letter up.
const ALL_ROLES: [Role; 24] = [
    Role::Lock,
    Role::Queue,
    Role::QueueDeadlines,
    Role::Notice,
    Role::Idempotency,
    Role::IdempotencyNotice,
    Role::RwWriter,
    Role::RwReaders,
    Role::RwQueue,
    Role::RwNotice,
    Role::RwFences,
    Role::RwDeadlines,
    Role::SemaphoreHolders,
    Role::SemaphoreQueue,
    Role::SemaphoreNotice,
    Role::SemaphoreWriter,
    Role::SemaphoreFences,
    Role::SemaphoreDeadlines,
    Role::Leader,
    Role::LeaderQueue,
    Role::LeaderDeadlines,
    Role::LeaderNotice,
    Role::LeaderRecord,
    Role::LeaderLabels,
];
