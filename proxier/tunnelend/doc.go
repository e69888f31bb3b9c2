// Package tunnelend ends, on a backend's node, the IPVS tunnels (IPIP and
// GUE) that direct server return sends to the node's pods, and delivers
// the inner packets to the pods with the port remap, without entering the
// pods' network namespaces: mark rules, a policy rule and a local route,
// tunl0, fou's GUE port, DNAT by mark and the SYN-ACK clamp. README.md
// says what each hook does and why.
package tunnelend
