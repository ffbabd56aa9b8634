use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<orderid>")]
async fn pay(order_id: u64, amount: u64) -> Result<(), LockError> {
    let _ = (order_id, amount);
    Ok(())
}

struct Orders;

impl Orders {
    #[distributed_lock(key = "{tenant:<self.tenant>}:<order>:<x>")]
    async fn create(&self, order: &u64) -> Result<(), LockError> {
        let _ = order;
        Ok(())
    }
}

#[distributed_lock(key = "job:<self.name>")]
async fn nightly() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
