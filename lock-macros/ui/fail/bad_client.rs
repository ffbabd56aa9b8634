use lock_runtime::{LockError, distributed_lock};

struct Service {
    locks: String,
}

impl Service {
    #[distributed_lock(key = "job", client = self.locks)]
    async fn job(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
