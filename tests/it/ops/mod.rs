//! Running the gateway: the command line (`cli`), its logs (`logs`), its
//! metrics (`metrics`), readiness (`readiness`), live configuration
//! (`reload`), graceful shutdown (`shutdown`) and traces (`tracing`).

mod cli;
mod dashboards;
mod logs;
mod metrics;
mod readiness;
mod reload;
mod shutdown;
mod tracing;
