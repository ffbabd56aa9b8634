//! The `#[distributed_lock]` attribute. Use it through `lock_runtime::distributed_lock`.

use proc_macro::TokenStream;

/// Placeholder; replaced by the attribute implementation.
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
