//! Running the gateway: the command line (`cli`), its logs (`logs`), its
//! metrics (`metrics`), its admin API's contract (`openapi`), readiness
//! (`readiness`), live configuration
//! (`reload`), graceful shutdown (`shutdown`) and traces (`tracing`).

mod cli;
mod dashboards;
mod logs;
mod metrics;
mod openapi;
mod readiness;
mod reload;
mod shutdown;
mod tracing;
