//! The HTTP side of the gateway: what a request must look like and what of
//! it reaches the upstream (`request_hygiene`), the server's connection
//! handling (`server`), and TLS on every side (`tls`).

mod request_hygiene;
mod server;
mod tls;
