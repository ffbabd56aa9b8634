use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = ["account:<from>", "account:<too>", "ledger:<self.id>"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:<from", "account:<to>"])]
async fn unclosed(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
