//! Features beyond the guarantees: keys taken from anywhere in the request
//! for webhook senders and brokers (`webhooks`), shadow mode (`shadow`), and
//! the `keys` commands and admin endpoint that fix a held key (`keys`).

mod keys;
mod shadow;
mod webhooks;
