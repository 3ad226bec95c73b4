package datapath

import (
	"errors"
	"strings"
	"testing"

	"github.com/hostaccel/hostaccel/internal/model"
	"github.com/hostaccel/hostaccel/internal/probe"
)

func kernel(features ...string) probe.Result {
	var r probe.Result
	for _, f := range probe.All {
		avail := false
		for _, g := range features {
			avail = avail || f == g
		}
		r.Features = append(r.Features, probe.Feature{Name: f, Available: avail})
	}
	return r
}

var (
	full     = kernel(probe.All...)
	noFT     = kernel(probe.NFTables, probe.TCX, probe.ClsBPF, probe.RedirectNeigh, probe.ConntrackKfuncs) // this host
	noEBPF   = kernel(probe.NFTables, probe.Flowtable, probe.FlowtableCounter)
	allClass = []model.Class{model.PodToPod, model.NodeToRemotePod, model.ExternalToNodePort}
)

func TestChooseAuto(t *testing.T) {
	s := model.State{Datapath: model.DatapathAuto, Classes: allClass}
	p, err := Choose(s, full)
	if err != nil || p.Summary() != "tc: [pod-to-pod node-to-remote-pod]; flowtable: [external-to-nodeport]" {
		t.Errorf("full kernel: %s %v", p.Summary(), err)
	}
	p, err = Choose(s, noEBPF)
	if err != nil || p.TC != nil || len(p.Flowtable.Classes) != 3 {
		t.Errorf("no eBPF: %s %v", p.Summary(), err)
	}
	// Without the flowtable, auto still runs tc for what it can, and says what it cannot.
	p, err = Choose(s, noFT)
	if !errors.Is(err, ErrNoFlowtable) || p.Flowtable != nil || p.Summary() != "tc: [pod-to-pod node-to-remote-pod]" {
		t.Errorf("no flowtable: %s %v", p.Summary(), err)
	}
}

// With the NAT check (conntrack kfuncs) tc serves its classes beside the NAT classes; without
// it auto cannot know that this node does not DNAT Pod traffic (a backend Pod's reply would
// skip the un-DNAT), so the flowtable keeps them, unless the user says there is no such NAT.
func TestChooseAutoNAT(t *testing.T) {
	s := model.State{Datapath: model.DatapathAuto, Classes: append([]model.Class{model.PodToService}, allClass...)}
	if p, err := Choose(s, full); err != nil || p.Summary() != "tc: [pod-to-pod node-to-remote-pod]; flowtable: [pod-to-service external-to-nodeport]" || len(p.Notes) > 0 {
		t.Errorf("pod-to-service on, NAT check: %s %v %v", p.Summary(), p.Notes, err)
	}
	noCT := kernel(probe.NFTables, probe.Flowtable, probe.FlowtableCounter, probe.TCX, probe.ClsBPF, probe.RedirectNeigh)
	for _, cs := range [][]model.Class{{model.PodToPod}, s.Classes} {
		s := model.State{Datapath: model.DatapathAuto, Classes: cs}
		p, err := Choose(s, noCT)
		if err != nil || p.TC != nil || len(p.Flowtable.Classes) != len(cs) || len(p.Notes) != 1 {
			t.Errorf("%v without the NAT check: %s %v %v", cs, p.Summary(), p.Notes, err)
		}
		s.TCNATCheck = model.NATCheckOff
		if p, err := Choose(s, noCT); err != nil || p.TC == nil || len(p.Notes) > 0 {
			t.Errorf("%v, natCheck off: %s %v %v", cs, p.Summary(), p.Notes, err)
		}
	}
	// Asked for explicitly, tc runs, and says what it risks.
	s = model.State{Datapath: model.DatapathTC, Classes: []model.Class{model.PodToPod}}
	if p, err := Choose(s, noCT); !errors.Is(err, ErrTCNotNATSafe) || p.TC == nil {
		t.Errorf("tc without the NAT check: %s %v", p.Summary(), err)
	}
}

func TestChooseExplicit(t *testing.T) {
	s := model.State{Datapath: model.DatapathFlowtable, Classes: allClass}
	if _, err := Choose(s, noFT); !errors.Is(err, ErrNoFlowtable) {
		t.Errorf("flowtable without kernel support: %v", err)
	}
	s.Datapath = model.DatapathTC
	if p, err := Choose(s, noFT); err != nil || p.TC == nil || p.Flowtable != nil {
		t.Errorf("tc: %s %v", p.Summary(), err)
	}
	if _, err := Choose(s, noEBPF); !errors.Is(err, ErrNoTC) {
		t.Errorf("tc without eBPF: %v", err)
	}
	s.Datapath = model.DatapathNone
	if p, err := Choose(s, full); err != nil || p.Summary() != "no fastpath" {
		t.Errorf("none: %s %v", p.Summary(), err)
	}
}

// Without CAP_SYS_ADMIN the tc probes fail as if the kernel lacked tc: the error and auto's
// note name the capability, not the kernel; without CAP_NET_ADMIN the flowtable's say so.
func TestChoosePrivilege(t *testing.T) {
	noSysAdmin := kernel(probe.NFTables, probe.Flowtable, probe.FlowtableCounter, probe.RedirectNeigh, probe.ConntrackKfuncs)
	noSysAdmin.MissingCapabilities = []string{probe.CapSysAdmin}
	s := model.State{Datapath: model.DatapathTC, Classes: []model.Class{model.PodToPod}}
	_, err := Choose(s, noSysAdmin)
	var perr *probe.PrivilegeError
	if !errors.As(err, &perr) || errors.Is(err, ErrNoTC) ||
		err.Error() != "the tc datapath needs CAP_NET_ADMIN and CAP_SYS_ADMIN; this process lacks CAP_SYS_ADMIN (run as root, or add the capabilities to the container's securityContext: docs/deploy.md)" {
		t.Errorf("tc without CAP_SYS_ADMIN: %v", err)
	}
	// Even where the probes passed (tc needs CAP_SYS_ADMIN after the probes too).
	withTC := full
	withTC.MissingCapabilities = []string{probe.CapSysAdmin}
	if _, err := Choose(s, withTC); !errors.As(err, &perr) {
		t.Errorf("tc probed, CAP_SYS_ADMIN missing: %v", err)
	}

	s.Datapath = model.DatapathAuto
	p, err := Choose(s, noSysAdmin)
	if err != nil || p.TC != nil || p.Flowtable == nil || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "lacks CAP_SYS_ADMIN") {
		t.Errorf("auto without CAP_SYS_ADMIN: %s %v %v", p.Summary(), p.Notes, err)
	}
	// No tc class: nothing to say about tc.
	s.Classes = []model.Class{model.ExternalToNodePort}
	if p, err := Choose(s, noSysAdmin); err != nil || len(p.Notes) != 0 {
		t.Errorf("auto, no tc class, without CAP_SYS_ADMIN: %v %v", p.Notes, err)
	}

	noNetAdmin := kernel()
	noNetAdmin.MissingCapabilities = []string{probe.CapNetAdmin, probe.CapSysAdmin}
	s = model.State{Datapath: model.DatapathFlowtable, Classes: allClass}
	if _, err := Choose(s, noNetAdmin); !errors.As(err, &perr) || errors.Is(err, ErrNoFlowtable) || !strings.Contains(err.Error(), "the flowtable datapath needs CAP_NET_ADMIN; this process lacks CAP_NET_ADMIN") {
		t.Errorf("flowtable without CAP_NET_ADMIN: %v", err)
	}
	s.Datapath = model.DatapathAuto
	if _, err := Choose(s, noNetAdmin); !errors.As(err, &perr) || perr.Part != probe.PartFlowtable {
		t.Errorf("auto without CAP_NET_ADMIN: %v", err)
	}
}

// local-pod-to-pod: socket to socket where sockmap.auto allows it and the kernel has sockmap,
// else tc (bpf_redirect_peer) where auto chooses tc, else the flowtable (it passes the forward
// hook), with a note; datapath sockmap without it is an error. Without sockmap.auto, auto never
// picks sockmap (a splice(2) reader loses moved data), and says nothing of it.
func TestChooseSockmap(t *testing.T) {
	s := model.State{Datapath: model.DatapathAuto, Classes: []model.Class{model.LocalPodToPod, model.PodToPod}}
	if p, err := Choose(s, full); err != nil || p.Summary() != "tc: [local-pod-to-pod pod-to-pod]" || len(p.Notes) > 0 {
		t.Errorf("full kernel, sockmap.auto off: %s %v %v", p.Summary(), p.Notes, err)
	}
	s.SockmapInAuto = true
	if p, err := Choose(s, full); err != nil || p.Summary() != "sockmap: [local-pod-to-pod]; tc: [pod-to-pod]" || len(p.Notes) > 0 {
		t.Errorf("full kernel: %s %v %v", p.Summary(), p.Notes, err)
	}
	noSM := kernel(probe.NFTables, probe.Flowtable, probe.FlowtableCounter, probe.TCX, probe.ClsBPF, probe.RedirectNeigh, probe.ConntrackKfuncs)
	if p, err := Choose(s, noSM); err != nil || p.Summary() != "tc: [local-pod-to-pod pod-to-pod]" || len(p.Notes) != 1 {
		t.Errorf("no sockmap: %s %v %v", p.Summary(), p.Notes, err)
	}
	noSMnoCT := kernel(probe.NFTables, probe.Flowtable, probe.FlowtableCounter, probe.TCX, probe.ClsBPF, probe.RedirectNeigh)
	if p, err := Choose(s, noSMnoCT); err != nil || p.Summary() != "flowtable: [local-pod-to-pod pod-to-pod]" || len(p.Notes) != 2 {
		t.Errorf("no sockmap, no NAT check: %s %v %v", p.Summary(), p.Notes, err)
	}
	// sockmap without the FIONREAD fix: auto passes, an explicit choice runs with a note.
	noFIONREAD := kernel(probe.NFTables, probe.Flowtable, probe.TCX, probe.ClsBPF, probe.RedirectNeigh, probe.ConntrackKfuncs, probe.SockMap)
	if p, err := Choose(s, noFIONREAD); err != nil || p.Sockmap != nil || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "FIONREAD") {
		t.Errorf("no FIONREAD fix: %s %v %v", p.Summary(), p.Notes, err)
	}
	s.Datapath, s.Classes = model.DatapathSockmap, []model.Class{model.LocalPodToPod}
	if p, err := Choose(s, noFIONREAD); err != nil || p.Sockmap == nil || len(p.Notes) != 1 {
		t.Errorf("datapath sockmap, no FIONREAD fix: %s %v %v", p.Summary(), p.Notes, err)
	}
	if p, err := Choose(s, full); err != nil || p.Sockmap == nil || p.TC != nil || p.Flowtable != nil {
		t.Errorf("datapath sockmap: %s %v", p.Summary(), err)
	}
	if _, err := Choose(s, noSM); !errors.Is(err, ErrNoSockmap) {
		t.Errorf("datapath sockmap without it: %v", err)
	}
}
