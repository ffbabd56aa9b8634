use lock_runtime::{LockError, distributed_lock};

const KEY: &str = "order:<id>";
const TTL: &str = "30s";

// Every option is `name = value`: the key too.
#[distributed_lock("order:<id>")]
async fn positional(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// The attribute reads its values at compile time: literals only.
#[distributed_lock(key = KEY, ttl = TTL, renew = RENEW)]
async fn constants(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
