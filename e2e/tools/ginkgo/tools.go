//go:build tools

// Package ginkgo pins Ginkgo's command-line runner at the version
// Kubernetes v1.36.3's e2e suite is built with (e2e/tools/k8se2e's go.mod): it
// runs a compiled e2e.test on several parallel processes, as upstream's
// hack/ginkgo-e2e.sh does. A module of its own, so that neither the main
// module nor the suite's cache key sees it.
package ginkgo

import _ "github.com/onsi/ginkgo/v2/ginkgo"
