use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = ["a:<x>", "b:<x>"], rw = "write")]
async fn read_write(x: u64) -> Result<(), LockError> {
    let _ = x;
    Ok(())
}

#[distributed_lock(permits = 2, keys = ["a:<x>", "b:<x>"])]
async fn semaphore(x: u64) -> Result<(), LockError> {
    let _ = x;
    Ok(())
}

fn main() {}
