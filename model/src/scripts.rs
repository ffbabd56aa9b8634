//! The Lua scripts this model mirrors, with the SHA-1 of the text each
//! model transition was written against. `tests/scripts.rs` fails when a
//! script changes (or a new one appears) until the model is brought along.

/// `(file in lock-runtime/scripts, SHA-1 of its text, where the model mirrors it)`.
pub const MIRRORED: &[(&str, &str, &str)] = &[
    (
        "acquire.lua",
        "37700925ebea65f6e3c925158da8b1ab4ac4dcd0",
        "lock.rs `Server::acquire`; redlock.rs `Node::acquire`",
    ),
    (
        "extend.lua",
        "4ea30c43f8980849f88c940b319639b59ab90a81",
        "lock.rs `Server::extend` (confirm)",
    ),
    (
        "extend_many.lua",
        "422006ece04fd85f5d3acd42fd2997fa6f29e1cf",
        "lock.rs `Server::extend` (watchdog); redlock.rs `Node::extend`",
    ),
    (
        "fence_raise.lua",
        "abb7c167397484529727affa6a1289fc3996952a",
        "redlock.rs `Node::fence_raise`",
    ),
    (
        "idempotency_claim.lua",
        "9e19f4c5d9072fe66ecaeb93d4378937b6742ed3",
        "records.rs `Record::claim`",
    ),
    (
        "idempotency_complete.lua",
        "5a7733ab0dd314ee418c93f80909c21413eaf560",
        "records.rs `Record::complete`",
    ),
    (
        "idempotency_release.lua",
        "a9d829d88940e383e36d4468eac6a09e95a0c619",
        "records.rs `Record::release`",
    ),
    (
        "idempotency_renew.lua",
        "15b32ccb7c35632a72af7d15ee2cd75d0264434f",
        "records.rs `Record::renew`",
    ),
    (
        "release.lua",
        "d5a79fa5650179b9cd595559c113f9a9b484bd75",
        "lock.rs `Server::release`; redlock.rs `Node::release`",
    ),
];
