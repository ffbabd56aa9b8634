//! The Lua scripts this model mirrors, with the SHA-1 of the text each
//! model transition was written against. `tests/scripts.rs` fails when a
//! script changes (or a new one appears) until the model is brought along.

/// `(file in lock-runtime/scripts, SHA-1 of its text, where the model mirrors it)`.
pub const MIRRORED: &[(&str, &str, &str)] = &[
    (
        "acquire.lua",
        "05980613324006e452c3dfef009fdf7e47e8c3f0",
        "lock/server.rs `Server::acquire` (its `pin`: `Server::pin`; its free path's \
         hand-over: `Server::hand_to_head`; the plain `SET NX` sent before it, whose nil \
         answer sends it: `Server::set_nx`, `Req::SetNx`); redlock.rs `Node::acquire`. A leader election's record and candidates' labels \
         (KEYS[5], KEYS[6]) are written beside each grant and not modelled: they never \
         decide who holds the lock; tests/tests/leader.rs covers them",
    ),
    (
        "acquire_all.lua",
        "bb7efc0977ee209c40c458adf42eff2c03b2b95d",
        "not modelled on its own: seen from any one of its keys (the model has one), \
         it is a try-once acquire.lua that never queues: a free key with no live \
         waiter is taken (SET PX, INCR), a free key (or one pinned by its line past \
         its owner's deadline) with live waiters in line goes to the first of them \
         exactly as `Server::hand_to_head` hands it (entries whose wait ended \
         skipped, marked and pinned) and the call is busy, another owner's key is \
         busy, our own is re-armed keeping its mark and pin; its INCR is one the other keys of its slot share (`Action::OtherKey`); \
         all-or-none across keys is the atomicity of one script, and the client \
         side (global key order, roll-back) and the line are covered by \
         tests/tests/lock_all.rs and tests/tests/fifo_expiry.rs",
    ),
    (
        "batch.lua",
        "d9ed0aa45361f18fa2078bb00c523fba49c4a1e5",
        "not modelled on its own: the group commit's one call for several ops \
         (lock-runtime/src/backend/redis/batch.rs). The library composes it after \
         acquire.lua, release.lua and extend.lua, each text unchanged as a function \
         of its own KEYS and ARGV, and runs the ops one after the other inside one \
         script call. So a batch's effect is that of the same per-key scripts sent \
         back to back with nothing in between: one of the schedules the model \
         already explores (each script one atomic transition, `Server::acquire`, \
         `Server::release`, `Server::extend`), never a new one; a batch removes \
         interleavings and adds none, so the per-key atomicity the model checks is \
         all a batch needs. What the composition must get right is the slicing \
         (each op sees its own keys and arguments, and its own answer comes back \
         to its caller): tests/tests/batch.rs checks it on a server, a Sentinel \
         master and a cluster (a busy key in a batch fails only itself, a waiting \
         acquire in a batch queues and is handed the key by a later release, a \
         caller dropped while queued is left out)",
    ),
    (
        "extend.lua",
        "ca1688e36f9d1d4742596267d0663f23a138c6ee",
        "lock/server.rs `Server::extend` (confirm); a leader's record re-armed beside \
         the lease (KEYS[2]) is not modelled",
    ),
    (
        "extend_many.lua",
        "e139abec434a799eabc1e116cf1fa3386088e284",
        "lock/server.rs `Server::extend` (watchdog); redlock.rs `Node::extend`",
    ),
    (
        "fence.lua",
        "8480eccbfe839028e416ee8a34e0567c8badda33",
        "lock/state.rs `Store` (the fenced store every holder writes to: a write is \
         accepted when its token is at least the highest recorded, which it then \
         becomes, else refused and nothing written; `lock_runtime::fence::redis`); \
         the allow-listed commands it runs are data, outside the model, and \
         tests/tests/fence_redis.rs covers them",
    ),
    (
        "fence_record_raise.lua",
        "a1fa5c182e8d72be6b987ca1973e6a2782e797ba",
        "not modelled: an operator's `force_release` (backend/force.rs) raising a \
         `fence::redis` record to the key's counter; it only ever raises the record, \
         which is `Store`'s refusal of lower tokens (lock/state.rs) seen from outside, \
         and lockctl/tests/lockctl_cluster.rs covers it (the evicted holder's next \
         fenced write is refused, the next holder's passes)",
    ),
    (
        "fence_raise.lua",
        "abb7c167397484529727affa6a1289fc3996952a",
        "redlock.rs `Node::fence_raise`",
    ),
    (
        "idempotency_claim.lua",
        "eb4c2216c7e2bdb60e65ac2324b6749153cda835",
        "records/server.rs `State::exec` (`Req::Claim`; the plain `SET NX` sent \
         before it, whose nil answer sends it: `Req::SetNx`)",
    ),
    (
        "idempotency_settle.lua",
        "07eebee3eed696f6e840da0b8fc55905a6878d8e",
        "records/server.rs `State::exec` (`Req::Complete`: with a response; \
         `Req::Release`: without one)",
    ),
    (
        "idempotency_commit.lua",
        "da66b59ada13117c4f3d3344bda2e859c1050059",
        "records/commit.rs `State::exec_store` (`Req::Commit`: the work and its committed \
         copy in one step, nothing written when a copy is there), with the look before a \
         handler runs (`Req::Look`); the commands themselves are `fence.lua`'s encoding, \
         tests/tests/http_idempotency_commit.rs, tests/tests/records_commit.rs and fault \
         scenario 13 (`fault run exactly-once-redis,exactly-once-postgres`: processes \
         SIGKILLed) cover them",
    ),
    (
        "idempotency_commit_record.lua",
        "2bf8154f5d45b90b0062134557d8a87f9f8195b4",
        "records/commit.rs `State::commit_record` (`Req::Commit` sent to the lock server, \
         `StoreConfig::LOCK_SERVER`: the work's writes and the record completed in one \
         step whoever's claim the record holds, or none; nothing written when it is \
         completed, whose result is then the answer; no look before a handler runs and no \
         completion after); the `waited` mark's notice is not modelled (it changes no \
         state), nor the answer for a key that holds no record; the commands themselves are \
         `fence.lua`'s encoding, and tests/tests/records_commit_on_lock_server.rs covers \
         them",
    ),
    (
        "idempotency_renew_many.lua",
        "e86e7288684e2910ca9411382f99aebc6d8943a3",
        "records/server.rs `State::renew` (per record of the batch)",
    ),
    (
        "mint.lua",
        "cf2f9664330dd00da29b228122ecdc53d70b57bc",
        "lock/server.rs `Server::mint` (from `Action::Mint`, `Held::fencing_token`)",
    ),
    (
        "probe.lua",
        "475a72b0107ab95f32797cff2f8bc913f51b0ab9",
        "not modelled: it reads no key and writes nothing (it answers whether the \
         server is Valkey 9 or later, or Redis 8.4 or later, so the client may \
         release with DELIFEQ or DELEX .. IFEQ). DELIFEQ, DELEX .. IFEQ and \
         unlock.lua have one semantics, which `Server::unlock` models; a server \
         that refuses the native command leaves the key as it was, and the \
         client sends unlock.lua instead (tests/tests/plain_path.rs)",
    ),
    (
        "release.lua",
        "b4150d6279017aee024c06b987a38da6afecce52",
        "lock/server.rs `Server::release` (its hand-over: `Server::hand_to_head`; the \
         plain compare-and-delete sent before it, whose 0 sends it: `Server::unlock`, \
         `Req::Unlock`); redlock.rs `Node::release`. A leader election's record (written on a \
         hand-over, deleted on a release to nobody) is not modelled",
    ),
    (
        "reserve.lua",
        "1365fdc60b72b225017a3ec13f2b52ee268bd27d",
        "lock/server.rs `Server::reserve` (from `LockModel::hand_on`, client/handover.rs `hand_on`)",
    ),
    (
        "shared.lua",
        "55926e7a2bebe49ecb7b2f70397fa0a6d8fafb4f",
        "shared.rs `Holders::acquire`, `release`, `extend`, `mint` (run by \
         `LockModel::exec_shared`)",
    ),
    (
        "unlock.lua",
        "27a2878c6157d614f55540c72fc627fc71f8f7fe",
        "lock/server.rs `Server::unlock` (the same compare-and-delete as Valkey's \
         `DELIFEQ` and Redis's `DELEX .. IFEQ`, which the model does not tell apart)",
    ),
];
