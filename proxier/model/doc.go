// Package model is ipvs-proxy's desired state as plain data, with no kernel
// imports: the plan of one Service (Build, a pure function of the Service, its
// EndpointSlices, the node and the configuration), the ownership rule, and
// the one diff (Diff) that turns desired plans and a view of the kernel into
// the operations (ktypes.Op, over the value types of netlinkutil/ktypes) a
// sync applies and `ipvs-proxy status` reports as drift.
package model
