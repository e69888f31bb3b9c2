// Package agentapi is the wire format between the test VM's guest agent
// (e2e/guest/vmagent, running inside the VM) and its host-side client (package
// e2e/framework/vm). It holds plain JSON types and constants only, so that
// both sides can import it without pulling in the other.
//
// Every request carries the header Authorization: Bearer <token>; the token
// is a per-boot random string the host packs into the guest's initramfs at
// TokenPath.
package agentapi

// Guest-side constants shared by the host and the guest.
const (
	// GuestAddr is the guest's address on QEMU's user network (slirp).
	GuestAddr = "10.0.2.15"
	// Port is where the agent listens inside the guest.
	Port = 7777
	// AgentPath is where the agent binary lives inside the guest; it is also
	// the command for the traffic subcommands (netns, serve, hit).
	AgentPath = "/usr/bin/vmagent"
	// TokenPath holds the per-boot token inside the guest.
	TokenPath = "/etc/vmagent.token"
	// InitErrorsPath is where /init records what failed during boot (a
	// module that did not load, ...). Ping reports its content.
	InitErrorsPath = "/run/vm-init.errors"
	// EnvInVM is set to "1" in the environment of everything the agent
	// runs, so a Go test binary can tell it runs inside the test VM.
	EnvInVM = "IPVS_PROXY_IN_VM"
)

// HTTP endpoints of the agent. All take and return JSON with POST, except
// PathPing (GET).
const (
	PathPing     = "/ping"
	PathRun      = "/run"
	PathStart    = "/proc/start"
	PathOutput   = "/proc/output"
	PathStop     = "/proc/stop"
	PathWrite    = "/file/write"
	PathUpload   = "/file/upload"
	PathPoweroff = "/poweroff"
	// PathDial (GET, ?addr=HOST:PORT, with "Connection: Upgrade" and
	// "Upgrade: "+DialUpgrade) dials addr over TCP from inside the guest
	// and answers 101 Switching Protocols; the HTTP connection then carries
	// the TCP connection's bytes both ways. The host reaches the guest's
	// addresses (node, pods) through it.
	PathDial = "/dial"
)

// DialUpgrade is the Upgrade protocol of PathDial.
const DialUpgrade = "tcp"

// PingResponse answers PathPing.
type PingResponse struct {
	// Uptime is the guest's /proc/uptime in seconds.
	Uptime float64 `json:"uptime"`
	Kernel string  `json:"kernel"`
	// InitErrors is what /init could not do, one line each; empty when all
	// went well.
	InitErrors string `json:"init_errors,omitempty"`
}

// RunRequest runs a command to completion.
type RunRequest struct {
	Argv []string `json:"argv"`
	// Env is appended to the agent's environment.
	Env   []string `json:"env,omitempty"`
	Dir   string   `json:"dir,omitempty"`
	Stdin []byte   `json:"stdin,omitempty"`
	// TimeoutMS kills the command (its whole process group) after this many
	// milliseconds; 0 means the agent's default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// RunResponse is the outcome of a RunRequest.
type RunResponse struct {
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
	// ExitCode is the exit status, or -1 when the command was killed by a
	// signal (including the timeout).
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out,omitempty"`
	// Error is set when the command could not be started at all.
	Error string `json:"error,omitempty"`
}

// StartRequest starts a background process; its stdout and stderr are
// kept, interleaved, for OutputRequest.
type StartRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
}

// StartResponse names the started process.
type StartResponse struct {
	ID int `json:"id"`
}

// OutputRequest asks for a background process's output from byte offset
// Since (counted from the process's first output byte) on.
type OutputRequest struct {
	ID    int   `json:"id"`
	Since int64 `json:"since"`
}

// ProcStatus is a background process's state and new output.
type ProcStatus struct {
	// Output is the output from offset From to Next. From is larger than
	// the requested Since when the agent has dropped old output (it keeps
	// the last few MiB).
	Output []byte `json:"output"`
	From   int64  `json:"from"`
	Next   int64  `json:"next"`
	// Exited and ExitCode (-1 when killed by a signal) tell whether and how
	// the process ended.
	Exited   bool `json:"exited"`
	ExitCode int  `json:"exit_code"`
}

// StopRequest stops a background process: SIGTERM to its process group,
// then SIGKILL after GraceMS (0 means the agent's default of 5 s); with
// Kill, SIGKILL at once.
type StopRequest struct {
	ID      int   `json:"id"`
	GraceMS int64 `json:"grace_ms,omitempty"`
	Kill    bool  `json:"kill,omitempty"`
	// Since works as in OutputRequest for the returned ProcStatus.
	Since int64 `json:"since"`
}

// WriteRequest writes a file, creating its parent directories.
type WriteRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Data []byte `json:"data"`
}

// PathUpload takes a file's content as the raw request body (POST, any
// Content-Type) and its guest path and octal mode in the query:
// /file/upload?path=/usr/local/bin/x&mode=755. It answers like PathWrite.

// HTTPResult is what `vmagent http` prints: the status code and the body
// of one GET, whatever the code.
type HTTPResult struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// ErrorResponse is the body of any non-200 answer.
type ErrorResponse struct {
	Error string `json:"error"`
}
