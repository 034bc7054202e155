//! Running the gateway: the command line (`cli`), its logs (`logs`), its
//! metrics (`metrics`), readiness (`readiness`), live configuration
//! (`reload`) and graceful shutdown (`shutdown`).

mod cli;
mod dashboards;
mod logs;
mod metrics;
mod readiness;
mod reload;
mod shutdown;
