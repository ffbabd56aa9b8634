use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "exports", permits = "x")]
async fn a_string() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "exports", permits = 2.5)]
async fn a_float() -> Result<(), LockError> {
    Ok(())
}

const PERMITS: u32 = 4;

#[distributed_lock(key = "exports", permits = PERMITS)]
async fn a_constant() -> Result<(), LockError> {
    let _ = PERMITS;
    Ok(())
}

#[distributed_lock(key = "exports", permits = 4i32)]
async fn a_signed_suffix() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
