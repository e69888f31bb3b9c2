// Package reconciler applies Services' plans to the kernel's IPVS and the
// interface: it keeps the desired plans and who holds each virtual server,
// a view of the owned part of the kernel, and a status with its own backoff
// per Service; each sync diffs (model.Diff) what changed, or everything,
// and applies it a piece at a time. Its parts, a file each: reconciler.go
// (the type, its inputs and Sync), scope.go (what a sync looks at),
// apply.go (the writes), kernelread.go (reading the kernel under the
// ownership rule), claims.go, servicestatus.go, drain.go, orphans.go and
// resync.go (the sliced periodic resync and its read off the loop).
package reconciler
