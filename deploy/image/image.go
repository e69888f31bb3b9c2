package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
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

// Where things are in the image.
const (
	binaryPath = "/usr/local/bin/ipvs-proxy"
	imagePATH  = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// spec describes an image to assemble.
type spec struct {
	// Binary is the static ipvs-proxy binary.
	Binary string
	// Userland is a directory tree (Debian's iptables, kmod and their
	// libraries, unpacked) that becomes the first layer.
	Userland string
	// UserlandDesc says what Userland holds (the layer's history).
	UserlandDesc string
	// Arch is the GOARCH / Debian architecture of both, e.g. amd64.
	Arch string
	// Epoch is the time of every file and of the image (reproducible
	// builds: the same inputs give the same digests).
	Epoch time.Time
	// Labels are the image's labels.
	Labels map[string]string
}

// elfArch maps an ELF machine to the image architecture.
var elfArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// checkStatic fails unless p is a statically linked ELF executable (no
// program interpreter, no shared libraries); it returns its architecture.
func checkStatic(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("binary %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return "", fmt.Errorf("binary %s is dynamically linked: build it with CGO_ENABLED=0 (make build)", p)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return "", fmt.Errorf("binary %s needs shared libraries %v: build it with CGO_ENABLED=0 (make build)", p, libs)
	}
	arch, ok := elfArch[f.Machine]
	if !ok {
		return "", fmt.Errorf("binary %s: unsupported machine %v", p, f.Machine)
	}
	return arch, nil
}

// tarWriter writes reproducible tar entries: root-owned, one fixed time.
type tarWriter struct {
	tw    *tar.Writer
	epoch time.Time
	dirs  map[string]bool
	// plainModes writes 0755 directories and 0644 files whatever the
	// files' modes (for the archive's own files).
	plainModes bool
}

func newTarWriter(w io.Writer, epoch time.Time) *tarWriter {
	return &tarWriter{tw: tar.NewWriter(w), epoch: epoch, dirs: map[string]bool{}}
}

func (t *tarWriter) header(h *tar.Header) error {
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	h.ModTime, h.AccessTime, h.ChangeTime = t.epoch, time.Time{}, time.Time{}
	h.Format = tar.FormatPAX
	h.PAXRecords = nil
	if t.plainModes {
		h.Mode = 0o644
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
	}
	return t.tw.WriteHeader(h)
}

// parents adds the missing parent directories of name.
func (t *tarWriter) parents(name string) error {
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

func (t *tarWriter) symlink(name, target string) error {
	if err := t.parents(name); err != nil {
		return err
	}
	return t.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
}

func (t *tarWriter) file(name, src string, mode fs.FileMode) error {
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

// tree adds the directory tree at root (in lexical order; hard links
// become copies).
func (t *tarWriter) tree(root string) error {
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
			return t.file(name, p, tarMode(info.Mode()))
		}
		return fmt.Errorf("%s: unsupported file type %v", p, info.Mode().Type())
	})
}

func (t *tarWriter) close() error { return t.tw.Close() }

// layerFrom makes an OCI layer (gzip) from a tar built by fill.
func layerFrom(fill func(*tarWriter) error, epoch time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := newTarWriter(&buf, epoch)
	if err := fill(tw); err != nil {
		return nil, err
	}
	if err := tw.close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}

// assemble builds the image: the userland layer, then the binary's layer;
// the binary is the entrypoint.
func assemble(s spec) (v1.Image, error) {
	userland, err := layerFrom(func(t *tarWriter) error { return t.tree(s.Userland) }, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("userland layer: %w", err)
	}
	bin, err := layerFrom(func(t *tarWriter) error {
		return t.file(strings.TrimPrefix(binaryPath, "/"), s.Binary, 0o755)
	}, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	created := v1.Time{Time: s.Epoch}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: userland, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: s.UserlandDesc}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer, History: v1.History{Created: created, CreatedBy: "ipvs-proxy " + binaryPath}},
	)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = s.Arch, "linux", created
	cf.Config.Entrypoint = []string{binaryPath}
	cf.Config.Cmd = []string{"run"}
	cf.Config.Env = []string{imagePATH}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// refNames returns the names an archive gives an image reference, as
// `docker save` does: the full name for containerd
// (io.containerd.image.name), the tag alone for the OCI ref.name, and the
// short name for Docker's manifest.json.
func refNames(ref string) (full, tag, short string, err error) {
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

// dockerManifest is one entry of the manifest.json that `docker load`
// reads; it points into the OCI layout's blobs, as `docker save` writes.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeArchive writes img as an OCI image layout in a tar file (an
// "oci-archive", with Docker's manifest.json too) named ref, atomically.
func writeArchive(img v1.Image, ref, out string, epoch time.Time) error {
	full, tag, short, err := refNames(ref)
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
	dm := dockerManifest{Config: "blobs/sha256/" + m.Config.Digest.Hex, RepoTags: []string{short}}
	for _, l := range m.Layers {
		dm.Layers = append(dm.Layers, "blobs/sha256/"+l.Digest.Hex)
	}
	b, err := json.Marshal([]dockerManifest{dm})
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
	tw := newTarWriter(f, epoch)
	tw.plainModes = true
	err = tw.tree(dir)
	err = errors.Join(err, tw.close(), f.Close())
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// sortedLabels is labels as sorted "k=v" lines (for printing).
func sortedLabels(l map[string]string) []string {
	var out []string
	for k, v := range l {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
