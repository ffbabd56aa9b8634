use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "a", ttl = "30")]
async fn unknown_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", wait = 2)]
async fn not_a_string() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", ttl = "10ms")]
async fn below_the_minimum() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", hold_at_least = "8d")]
async fn kept_longer_than_the_longest_lease() {}

// A parameter named only by the key: no "unused variable" beside the error.
#[distributed_lock(key = "order:<id>", ttl = "30")]
async fn parameter_in_the_key(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
