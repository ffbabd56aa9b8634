use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = ["report:<day>", "export:<day>"], hold_at_least = "5m")]
async fn nightly(day: u32) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

fn main() {}
