package main

import (
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
)

// sbomPath is where the image holds its SBOM (make image writes it with
// cyclonedx-gomod from the binary's build information).
const sbomPath = "/sbom.cdx.json"

// cycloneDX is what checkSBOM reads of a CycloneDX BOM in JSON.
type cycloneDX struct {
	BOMFormat  string `json:"bomFormat"`
	Components []struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"components"`
}

// checkSBOM fails unless the CycloneDX BOM at sbom lists every module the
// binary was built with, at the version it was built with (a replaced
// module at its replacement's): an SBOM of another build, or of another
// program, is refused. It returns how many modules it checked.
func checkSBOM(sbom, binary string) (int, error) {
	b, err := os.ReadFile(sbom)
	if err != nil {
		return 0, fmt.Errorf("sbom: %w", err)
	}
	var bom cycloneDX
	if err := json.Unmarshal(b, &bom); err != nil {
		return 0, fmt.Errorf("sbom %s: %w", sbom, err)
	}
	if bom.BOMFormat != "CycloneDX" {
		return 0, fmt.Errorf("sbom %s: bomFormat %q, want CycloneDX", sbom, bom.BOMFormat)
	}
	info, err := buildinfo.ReadFile(binary)
	if err != nil {
		return 0, fmt.Errorf("sbom: build information of %s: %w", binary, err)
	}
	listed := map[string][]string{}
	for _, c := range bom.Components {
		listed[c.Name] = append(listed[c.Name], c.Version)
	}
	var errs []error
	for _, m := range info.Deps {
		path, version := m.Path, m.Version
		if m.Replace != nil {
			path, version = m.Replace.Path, m.Replace.Version
		}
		if !slices.Contains(listed[path], version) {
			errs = append(errs, fmt.Errorf("%s %s: listed as %q", path, version, listed[path]))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("sbom %s does not describe %s: %w", sbom, binary, err)
	}
	return len(info.Deps), nil
}
