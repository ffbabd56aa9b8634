use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "report", hold_at_least = "8d")]
async fn over_the_longest_lease() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "sync", hold_at_least = "5 minutes please")]
async fn not_a_duration() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "digest", hold_at_least = 300)]
async fn not_a_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
