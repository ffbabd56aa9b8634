use lock_runtime::{LockError, distributed_lock};

struct Order {
    id: u64,
}

struct NotDisplay;

#[distributed_lock(key = "order:<order.number>")]
async fn no_such_field(order: &Order) -> Result<(), LockError> {
    let _ = order.id;
    Ok(())
}

#[distributed_lock(key = "x:<value>")]
async fn not_display(value: NotDisplay) -> Result<(), LockError> {
    let _ = value;
    Ok(())
}

fn main() {}
