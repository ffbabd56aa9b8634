use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "exports", permits = 0)]
async fn no_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "exports", permits = -1)]
async fn negative() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "exports", permits = 4294967296)]
async fn over_u32() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
