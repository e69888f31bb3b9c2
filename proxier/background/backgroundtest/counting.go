// Package backgroundtest has a background.Start for tests that counts what
// it starts.
package backgroundtest

import "sync"

// Counting is a background.Start (its Start method) that runs each
// function on a goroutine of its own and counts them.
type Counting struct {
	mu      sync.Mutex
	started int
}

// Start counts f and runs it on a new goroutine.
func (c *Counting) Start(f func()) {
	c.mu.Lock()
	c.started++
	c.mu.Unlock()
	go f()
}

// Count is how many functions Start has started.
func (c *Counting) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}
