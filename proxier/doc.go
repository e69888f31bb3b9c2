// Package proxier holds, in its sub-packages, everything ipvs-proxy does
// between the API and the kernel adapters; it has no code of its own.
// From the ground up: model (the pure plans and the one diff), consumer
// (what the sync loop drives besides IPVS), reconciler (applies the diff to
// IPVS with per-Service status), glue and healthcheck (consumers), agent
// (the change tracker, sync runner and reporter around them), and the
// operations built on the agent: config, opsserver, status, preflight,
// cleanup, sysctls. No sub-package imports a package above it; see
// README.md.
package proxier
