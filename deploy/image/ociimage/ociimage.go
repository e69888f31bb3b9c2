// Package ociimage assembles container images without a container
// engine: reproducible tar layers (root-owned files, one fixed time) and
// OCI image archives (an OCI image layout in a tar, with Docker's
// manifest.json too) that `ctr images import`, `podman load` and `docker
// load` read. deploy/image builds ipvs-proxy's image with it, and the
// e2e fixtures the test images of the one-node cluster.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TarWriter writes reproducible tar entries: root-owned, one fixed time.
type TarWriter struct {
	tw    *tar.Writer
	epoch time.Time
	dirs  map[string]bool
	// PlainModes writes 0755 directories and 0644 files whatever the
	// files' modes (for the archive's own files).
	PlainModes bool
}

// NewTarWriter writes a tar stream to w with every time set to epoch.
func NewTarWriter(w io.Writer, epoch time.Time) *TarWriter {
	return &TarWriter{tw: tar.NewWriter(w), epoch: epoch, dirs: map[string]bool{}}
}

func (t *TarWriter) header(h *tar.Header) error {
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	h.ModTime, h.AccessTime, h.ChangeTime = t.epoch, time.Time{}, time.Time{}
	h.Format = tar.FormatPAX
	h.PAXRecords = nil
	if t.PlainModes {
		h.Mode = 0o644
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
	}
	return t.tw.WriteHeader(h)
}

// parents adds the missing parent directories of name.
func (t *TarWriter) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." || dir == "/" || t.dirs[dir] {
		return nil
	}
	if err := t.parents(dir); err != nil {
		return err
	}
	t.dirs[dir] = true
	return t.header(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755})
}

// Symlink adds a symbolic link (and its missing parent directories).
func (t *TarWriter) Symlink(name, target string) error {
	if err := t.parents(name); err != nil {
		return err
	}
	return t.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
}

// File adds the host file src as name with mode (and its missing parent
// directories).
func (t *TarWriter) File(name, src string, mode fs.FileMode) error {
	if err := t.parents(name); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := t.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: st.Size(), Mode: int64(mode.Perm())}); err != nil {
		return err
	}
	if _, err := io.Copy(t.tw, f); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}

// tarMode is a tar header's mode bits of an fs.FileMode (permissions,
// setuid/setgid, sticky).
func tarMode(m fs.FileMode) fs.FileMode {
	out := m.Perm()
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

// Tree adds the directory tree at root (in lexical order; hard links
// become copies).
func (t *TarWriter) Tree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			t.dirs[name] = true
			return t.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(tarMode(info.Mode()))})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return t.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
		case info.Mode().IsRegular():
			return t.File(name, p, tarMode(info.Mode()))
		}
		return fmt.Errorf("%s: unsupported file type %v", p, info.Mode().Type())
	})
}

// Close writes the tar trailer.
func (t *TarWriter) Close() error { return t.tw.Close() }

// Layer makes an OCI layer (gzip) from a tar built by fill.
func Layer(fill func(*TarWriter) error, epoch time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := NewTarWriter(&buf, epoch)
	if err := fill(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}

// RefNames returns the names an archive gives an image reference, as
// `docker save` does: the full name for containerd
// (io.containerd.image.name), the tag alone for the OCI ref.name, and the
// short name for Docker's manifest.json.
func RefNames(ref string) (full, tag, short string, err error) {
	t, err := name.NewTag(ref, name.WithDefaultRegistry("docker.io"))
	if err != nil {
		return "", "", "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	repo, registry := t.RepositoryStr(), t.RegistryStr()
	if registry == name.DefaultRegistry { // go-containerregistry's "index.docker.io"
		registry = "docker.io"
	}
	full = registry + "/" + repo + ":" + t.TagStr()
	short = full
	if registry == "docker.io" {
		short = strings.TrimPrefix(repo, "library/") + ":" + t.TagStr()
	}
	return full, t.TagStr(), short, nil
}

// DockerManifest is one entry of the manifest.json that `docker load`
// reads; it points into the OCI layout's blobs, as `docker save` writes.
type DockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteArchive writes img as an OCI image layout in a tar file (an
// "oci-archive", with Docker's manifest.json too) named ref, atomically.
func WriteArchive(img v1.Image, ref, out string, epoch time.Time) error {
	full, tag, short, err := RefNames(ref)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ipvs-proxy-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          full,
		"org.opencontainers.image.ref.name": tag,
		"org.opencontainers.image.created":  epoch.UTC().Format(time.RFC3339),
	})); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	dm := DockerManifest{Config: "blobs/sha256/" + m.Config.Digest.Hex, RepoTags: []string{short}}
	for _, l := range m.Layers {
		dm.Layers = append(dm.Layers, "blobs/sha256/"+l.Digest.Hex)
	}
	b, err := json.Marshal([]DockerManifest{dm})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := NewTarWriter(f, epoch)
	tw.PlainModes = true
	err = tw.Tree(dir)
	err = errors.Join(err, tw.Close(), f.Close())
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// StaticImage is a one-layer image of static executables: files maps each
// path in the image to a host file (mode 0755); entrypoint is the image's
// entrypoint. Test images of the e2e cluster are made this way.
func StaticImage(files map[string]string, entrypoint []string, arch string, epoch time.Time) (v1.Image, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	layer, err := Layer(func(t *TarWriter) error {
		for _, n := range names {
			if err := t.File(strings.TrimPrefix(n, "/"), files[n], 0o755); err != nil {
				return err
			}
		}
		return nil
	}, epoch)
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	return Image([]ImageLayer{{Layer: layer, CreatedBy: "files " + strings.Join(names, " ")}},
		Config{Arch: arch, Epoch: epoch, Entrypoint: entrypoint})
}

// ImageLayer is a layer of an image and what its history says made it.
type ImageLayer struct {
	Layer     v1.Layer
	CreatedBy string
}

// Config is what an image's configuration says besides its layers.
type Config struct {
	// Arch is the GOARCH, e.g. amd64.
	Arch string
	// Epoch is the image's creation time.
	Epoch                time.Time
	Entrypoint, Cmd, Env []string
	Labels               map[string]string
}

// Image is an OCI image of layers (bottom first) and c; its working
// directory is /.
func Image(layers []ImageLayer, c Config) (v1.Image, error) {
	created := v1.Time{Time: c.Epoch}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l.Layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: l.CreatedBy}})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = c.Arch, "linux", created
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env = c.Entrypoint, c.Cmd, c.Env
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = c.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// FileDigest is the hex SHA-256 of a file's content: the cache key of an
// image archive built around that file.
func FileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
