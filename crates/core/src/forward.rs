//! The one mechanism by which a decorator of an async trait (the metered
//! store, broker and notices) forwards every method to what it wraps:
//! [`forward_to_inner!`](crate::forward_to_inner) implements the trait
//! from the list of its methods, each passing its arguments to
//! `self.inner` and its answer through `self.seen`. A method left out of
//! the list does not compile, so no method is forwarded by a hand copy
//! that could drift from the others.

/// Implements the async trait `$trait` for `$ty`, whose `inner` field
/// holds what it wraps and whose `seen(&self, Result<T, $error>)` method
/// looks at every answer on its way back. Each method is written as its
/// signature with the answer's `Ok` type alone:
///
/// ```ignore
/// toolfleet_core::forward_to_inner! {
///     impl Store, for MeteredStore, error StoreError {
///         fn ping(&self) -> ();
///         fn job(&self, tenant: &str, id: &str) -> Option<JobRecord>;
///     }
/// }
/// ```
///
/// Methods that are not async and answer no `Result` follow in a `plain`
/// list, forwarded as they are: a trait's method with a default body is
/// forwarded only if listed, so list every one.
///
/// The calling crate depends on `async-trait`.
#[macro_export]
macro_rules! forward_to_inner {
    (impl $trait:path, for $ty:ty, error $error:ty {
        $(fn $name:ident(&self $(, $arg:ident: $arg_ty:ty)*) -> $answer:ty;)*
    } $(plain {
        $(fn $plain:ident(&self $(, $parg:ident: $parg_ty:ty)*) -> $panswer:ty;)*
    })?) => {
        #[::async_trait::async_trait]
        impl $trait for $ty {
            $(
                async fn $name(&self $(, $arg: $arg_ty)*) -> ::std::result::Result<$answer, $error> {
                    self.seen(self.inner.$name($($arg),*).await)
                }
            )*
            $($(
                fn $plain(&self $(, $parg: $parg_ty)*) -> $panswer {
                    self.inner.$plain($($parg),*)
                }
            )*)?
        }
    };
}
