// Package ocitest reads back the OCI image archive that deploy/image writes,
// for the tests that check it (deploy/image's own and the end-to-end one).
package ocitest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// Untar unpacks a tar stream into dir: directories, regular files (with
// their permission bits) and symbolic links; any other entry is an error.
// Entry names are kept inside dir.
func Untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("untar: %w", err)
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Symlink(h.Linkname, p)
			}
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				var b []byte
				if b, err = io.ReadAll(tr); err == nil {
					err = os.WriteFile(p, b, os.FileMode(h.Mode).Perm())
				}
			}
		default:
			err = fmt.Errorf("entry type %c", h.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("untar %s: %w", h.Name, err)
		}
	}
}

// Archive is an OCI image-layout archive, unpacked and validated.
type Archive struct {
	Index v1.ImageIndex
	// Desc describes the archive's only image (its annotations carry the
	// image's names).
	Desc  v1.Descriptor
	Image v1.Image
}

// Open unpacks the archive file into dir and validates its index and its
// one image.
func Open(archive, dir string) (*Archive, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := Untar(f, dir); err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: OCI layout: %w", archive, err)
	}
	if err := validate.Index(idx); err != nil {
		return nil, fmt.Errorf("%s: invalid index: %w", archive, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", archive, err)
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d manifests in index.json, want 1", archive, len(im.Manifests))
	}
	a := &Archive{Index: idx, Desc: im.Manifests[0]}
	if a.Image, err = idx.Image(a.Desc.Digest); err != nil {
		return nil, fmt.Errorf("%s: image %s: %w", archive, a.Desc.Digest, err)
	}
	if err := validate.Image(a.Image); err != nil {
		return nil, fmt.Errorf("%s: invalid image: %w", archive, err)
	}
	return a, nil
}
