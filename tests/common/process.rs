//! Test support for tests that run the idemgate binary as a child process
//! and stop or restart PostgreSQL (filled in by the process-level tests).
