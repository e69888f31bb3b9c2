// Package ktypes is the ground floor that the kernel adapters (netlinkutil,
// ipset) and the model (proxier/model) share: the IPVS value types (virtual
// and real servers, their keys, protocols and flags) and one kernel write
// (Op). It is plain data with no kernel library, so the model can import it
// and the adapters never reach up into proxier/.
package ktypes
