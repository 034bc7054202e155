//! Features beyond the guarantees: unknown outcomes resolved by asking the
//! upstream (`inquiry`), keys taken from anywhere in the request
//! for webhook senders and brokers (`webhooks`), shadow mode (`shadow`), and
//! the `keys` commands and admin endpoint that fix a held key (`keys`),
//! an erasure that fails midway (`erase_failed`), and recorded responses
//! sealed under `[store] encryption_keys` (`sealed`).

mod demo;
mod erase_failed;
mod inquiry;
mod inquiry_contract;
mod keys;
pub(crate) mod sealed;
mod shadow;
mod webhooks;
