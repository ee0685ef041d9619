"""World: one generation's process groups (TP, PP, DP and one over all its ranks).

Built explicitly from a TCPStore with a fresh prefix per generation; it can be built in a
background thread while another World trains, connected (first collective done), activated
(registered with torch.distributed so that DCP can use it) and destroyed.
"""

from __future__ import annotations

import contextlib
import gc
import time
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

from liver.topology.layout import Layout
from liver.world import overlay, sharding
from liver.world.group import Group, connect_once
from liver.world.sever import sever
from liver.world.sharing import Sharing


def make_store(timeout_s: float = 600.0, host: str = "127.0.0.1", port: int = 0,
               advertise: str | None = None) -> tuple[dist.TCPStore, str]:
    """A job's TCPStore, served by this process (on a free port where ``port`` is 0); returns it
    and the address its clients use (``advertise``, else ``host``; this machine's name where
    ``host`` is 0.0.0.0). It listens on ``host``'s interface only (torch's own server listens on
    every interface: it is handed a socket bound here), on every one for 0.0.0.0 or ::."""
    timeout = timedelta(seconds=timeout_s)
    store = None
    if host not in ("0.0.0.0", "::", ""):
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(1024)
        try:
            store = dist.TCPStore(host, sock.getsockname()[1], is_master=True, wait_for_workers=False, timeout=timeout,
                                  master_listen_fd=sock.fileno())
            sock.detach()  # (the store owns the descriptor now and closes it: never twice, a reused number)
        except (TypeError, RuntimeError, ValueError):  # (a torch without it: every interface, as before)
            sock.close()
    if store is None:
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout)
    reach = advertise or (socket.gethostname() if host in ("0.0.0.0", "::") else host)
    return store, f"{reach}:{store.port}"


def connect_store(addr: str, timeout_s: float = 120.0) -> dist.TCPStore:
    """A client of the job's TCPStore at ``host:port``."""
    host, port = addr.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def _register_name(g: Group) -> bool:
    """Make ``g``'s communicator findable by its name (DeviceMesh and DTensor resolve groups by
    name), without installing anything as torch.distributed's default group. True if it was not
    before (a name left by a destroyed group of an earlier World is taken over)."""
    if g.pg is None or not hasattr(c10d, "_register_process_group"):
        return False
    try:
        c10d._resolve_process_group(g.pg.group_name)
        return False
    except Exception:
        _unregister_name(g.pg.group_name)
        c10d._register_process_group(g.pg.group_name, g.pg)
        return True


def _unregister_name(name: str) -> None:
    if hasattr(c10d, "_unregister_process_group"):
        try:
            c10d._unregister_process_group(name)
        except Exception:  # (not registered)
            pass


def forget_meshes(keep: dict | None = None, device: torch.device | None = None) -> None:
    """Drop what DTensor cached about meshes seen so far, before a model is laid out on a new one.

    DeviceMesh equality looks at ranks and shape only (not at the process's coordinate, nor at
    the groups): a mesh of another generation, or a fake one of a rehearsal, of the same shape
    compares equal, and DTensor's sharding propagation (a per-thread cache keyed by such specs)
    would hand back output specs that hold the old mesh object: a wrong coordinate, dead groups.
    Both of DTensor's caches are the calling thread's own (checked on torch 2.13: an op run in
    another thread leaves this thread's dispatch a miss), so this forgets only this thread's.
    The thread starts a new table of propagations (``sharding.py``), or takes ``keep``: one the
    companion filled for the World this thread now trains on (its first step then finds them).

    ``device``: where the model trains. On an accelerator a backward runs in autograd's own
    thread for that device, whose caches are its own too: they are forgotten there as well (found
    on one H200, torch 2.11: the first backward on a new mesh equal to an earlier one resolved the
    earlier one's destroyed group by name and failed)."""
    _forget_here(keep)
    if device is not None and device.type not in ("cpu", "meta"):
        x = torch.zeros((), device=device, requires_grad=True)
        _ForgetInBackward.apply(x, keep).backward()  # (autograd's device thread runs its backward)


class _ForgetInBackward(torch.autograd.Function):
    """Its backward, in whichever thread autograd runs it, forgets that thread's caches."""

    @staticmethod
    def forward(ctx, x, keep):
        ctx.keep = keep
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _forget_here(ctx.keep)
        return grad, None


def _forget_here(keep: dict | None) -> None:
    from torch.distributed.tensor import DTensor
    if hasattr(torch._C, "_clear_DTensor_sharding_propagator_cache"):  # the C++ dispatch's own cache
        torch._C._clear_DTensor_sharding_propagator_cache()
    prop = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    for cached in (getattr(prop, "propagate_op_sharding", None), getattr(prop, "_propagate_tensor_meta_cached", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    try:
        from torch.distributed.tensor import _redistribute
        if hasattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear"):
            _redistribute._gen_transform_infos.cache_clear()
    except ImportError:  # pragma: no cover
        pass
    sharding.forget(keep)


def _entries(g: Group) -> dict:
    """``g``'s entry in each of torch.distributed's maps of registered groups (``overlay.MAPS``);
    its members are generation ranks (a shared communicator keeps the name it was made with)."""
    return {"pg_map": (g.backend, None), "pg_names": g.pg.group_name,
            "pg_group_ranks": {m: i for i, m in enumerate(g.members)},
            "pg_backend_config": f"{g.device.type}:{g.backend}"}


def _register_group(g: Group) -> None:
    """Make torch.distributed know ``g`` (its members are generation ranks)."""
    w = c10d._world
    if g.pg is None or g.pg in w.pg_map:  # one communicator in two roles: registered once
        return
    gname = g.pg.group_name  # a shared communicator keeps the name it was made with
    for name, entry in _entries(g).items():
        getattr(w, name)[g.pg] = entry
    w.pg_to_tag[g.pg] = f"ptd:{gname}"
    w.tags_to_pg.setdefault(f"ptd:{gname}", []).append(g.pg)
    _register_name(g)  # (already, where the companion built on it: ``registered_here``)


class World:
    """The process groups of one generation, as seen by one of its ranks."""

    def __init__(self, generation: int, layout: Layout, rank: int, backend: str,
                 device: torch.device, groups: dict[str, Group], build_s: float,
                 cpu_groups: dict[str, Group] | None = None) -> None:
        self.generation = generation
        self.layout = layout
        self.rank = rank
        self.backend = backend
        self.device = device
        self.groups = groups
        # gloo groups on the CPU over the same ranks, for work beside training (periodic
        # checkpoints written by a background thread must not share the training groups)
        self.cpu_groups = cpu_groups or {}
        self.build_s = build_s
        self.connect_s = 0.0
        self._registered = False
        self._meshes: dict[bool, DeviceMesh] = {}
        self._solo: dict[str, Group] = {}  # one-member axes as real groups, for DeviceMesh

    # Training code asks the World for its groups; nothing reads the process-global default.
    @property
    def all(self) -> Group:
        return self.groups["all"]

    @property
    def tp(self) -> Group:
        return self.groups["tp"]

    @property
    def pp(self) -> Group:
        return self.groups["pp"]

    @property
    def dp(self) -> Group:
        return self.groups["dp"]

    @property
    def coord(self):
        return self.layout.coord(self.rank)

    @classmethod
    def build(cls, store: dist.Store, generation: int, layout: Layout, rank: int,
              backend: str = "gloo", device: torch.device | None = None,
              timeout: timedelta = timedelta(seconds=300), cpu_groups: bool = False,
              procs: list[int] | None = None, sharing: Sharing | None = None) -> "World":
        """Rendezvous this rank's groups of generation ``generation`` (blocks on its peers).
        Rank r is process ``procs[r]``; a group over the same processes as one in ``sharing``
        (or as another group of this World) shares its communicator instead of making one."""
        device = device or torch.device("cpu")
        sharing = sharing or Sharing()
        t0 = time.perf_counter()
        prefix = f"liver/gen{generation}"

        def make(name: str, members: list[int], be: str, dev: torch.device, lane: str = "train") -> Group:
            return sharing.group(store, f"{prefix}/{name}", members, rank, be, dev, timeout, procs, lane)

        groups = {"all": make("all", list(range(layout.size)), backend, device)}
        for axis, members_of in (("tp", layout.tp_group), ("dp", layout.dp_group),
                                 ("pp", layout.pp_group)):
            members = members_of(rank)
            groups[axis] = make(f"{axis}{layout.all_groups(axis).index(members)}", members, backend, device)
        cpu: dict[str, Group] = {}
        if cpu_groups:
            cpu_dev = torch.device("cpu")
            cpu["all"] = make("cpu_all", list(range(layout.size)), "gloo", cpu_dev, "side")
            members = layout.tp_group(rank)
            cpu["tp"] = make(f"cpu_tp{layout.all_groups('tp').index(members)}", members, "gloo", cpu_dev, "side")
        return cls(generation, layout, rank, backend, device, groups, time.perf_counter() - t0, cpu)

    def every_group(self) -> list[Group]:
        return [*self.groups.values(), *self.cpu_groups.values(), *self._solo.values()]

    def connect(self, training_thread: bool = True) -> float:
        """Run a first collective on every group so connection set-up is off the critical path,
        then ``connect_pipeline``."""
        t0 = time.perf_counter()
        connect_once(self.every_group())
        self.connect_pipeline(training_thread)
        self.connect_s = time.perf_counter() - t0
        return self.connect_s

    def connect_pipeline(self, training_thread: bool = True) -> None:
        """Point-to-point connections to the pipeline's neighbours, both ways; on a communicator
        shared with the Active World only from the training thread (``training_thread``)."""
        pp = self.pp
        neighbours = [r for r in (pp.rank - 1, pp.rank + 1) if 0 <= r < pp.size]
        if pp.usable_from(training_thread):
            pp.connect_p2p(neighbours, neighbours)

    # ---- a DeviceMesh over this generation's own groups -------------------------------------
    def mesh(self, cpu: bool = False) -> DeviceMesh:
        """A DeviceMesh of shape (pp, dp, tp), axes named "pp", "dp", "tp", over this generation's
        ranks, whose axes are this World's own groups and whose coordinate is this rank's in the
        generation (not the process's in torch's default group: a Shadow World renumbers
        processes). ``cpu``: over the CPU (gloo) groups where the World has them (only "tp").
        An axis of one member gets a real one-member group. Made once per World.

        Slicing it (``mesh["tp"]``) asks torch.distributed for the process's rank: only on the
        World that is registered (``activate``), whose default group numbers ranks as the mesh does."""
        if cpu in self._meshes:
            return self._meshes[cpu]
        lay = self.layout
        groups = self.cpu_groups if cpu else self.groups
        device_type = "cpu" if cpu else self.device.type
        ranks = torch.arange(lay.size).reshape(lay.pp, lay.dp, lay.tp)
        mesh = DeviceMesh(device_type, ranks, mesh_dim_names=("pp", "dp", "tp"), _init_backend=False, _rank=self.rank)
        axes = [self._with_pg(groups.get(axis) or self.groups[axis], cpu) for axis in ("pp", "dp", "tp")]
        for g in axes:
            _register_name(g)
        mesh._dim_group_names = [g.pg.group_name for g in axes]
        registry = getattr(mesh, "_pg_registry", None)
        if registry is not None:  # (torch >= 2.12 looks groups up here)
            registry.update({g.pg.group_name: g.pg for g in axes})
        self._meshes[cpu] = mesh
        return mesh

    def process_group(self, axis: str) -> dist.ProcessGroup:
        """torch's ``ProcessGroup`` of this rank's group along ``axis`` ("tp", "pp", "dp", "all"), a
        real one-member one where the axis has one member (libraries that take explicit groups,
        Megatron-Core's, call ``size()`` and ``rank()`` on every one they are given)."""
        return self._with_pg(self.groups[axis], False).pg

    def solo_process_group(self, name: str) -> dist.ProcessGroup:
        """A one-member ``ProcessGroup`` of this process alone, made once per ``name`` (a library's
        axis this job does not use: Megatron-Core's context parallelism)."""
        key = f"solo/{name}"
        if key not in self._solo:
            self._solo[key] = Group.solo(f"liver/gen{self.generation}/{key}", [self.rank], self.backend, self.device)
            if self._registered:
                _register_group(self._solo[key])
        return self._solo[key].pg

    def _with_pg(self, g: Group, cpu: bool) -> Group:
        if g.pg is not None:
            return g
        key = f"{'cpu_' if cpu else ''}{g.name}"
        if key not in self._solo:
            backend, device = ("gloo", torch.device("cpu")) if cpu else (self.backend, self.device)
            self._solo[key] = Group.solo(f"liver/gen{self.generation}/solo/{key}", g.members, backend, device)
            if self._registered:
                _register_group(self._solo[key])
        return self._solo[key]

    # ---- registration with torch.distributed (for DCP and DTensor) ------------------------
    def activate(self) -> None:
        """Install this generation as torch.distributed's default group, with its subgroups.

        Only the Active World is registered; a Shadow World uses its groups directly.
        """
        for g in self.every_group():
            _register_group(g)
        self._registered = True
        # (a one-rank World too: DeviceMesh asks the default group for this process's rank)
        c10d._update_default_pg(self._with_pg(self.all, False).pg)

    @contextlib.contextmanager
    def registered(self):
        """Registered (``activate``) for the duration; as before afterwards (the default group
        that was installed comes back)."""
        was, default = self._registered, c10d._world.default_pg
        self.activate()
        try:
            yield self
        finally:
            if not was:
                self.deactivate()
                c10d._update_default_pg(default)

    @contextlib.contextmanager
    def registered_here(self):
        """This World as the default group of this thread only, for the duration (``overlay``):
        the companion builds the next generation's model on its mesh while the training thread
        keeps the Active World's registration. Its groups are findable by name (DTensor's lookup)."""
        self.mesh()  # (its one-member axes made now, numbered with the rest)
        groups = [self._with_pg(g, False) for g in self.every_group()]
        added = [g.pg.group_name for g in groups if _register_name(g)]
        maps = {m: {} for m in overlay.MAPS}
        for g in groups:
            for name, entry in _entries(g).items() if g.pg is not None else ():
                maps[name][g.pg] = entry
        try:
            with overlay.here(self._with_pg(self.all, False).pg, maps):
                yield self
        finally:
            for name in added:  # (the switch registers them again: ``activate``)
                _unregister_name(name)

    def deactivate(self) -> None:
        if not self._registered:
            return
        w = c10d._world
        for g in self.every_group():
            if g.pg is None:
                continue
            gname = g.pg.group_name
            for d in (w.pg_map, w.pg_names, w.pg_group_ranks, w.pg_backend_config, w.pg_to_tag):
                d.pop(g.pg, None)
            w.tags_to_pg.pop(f"ptd:{gname}", None)
            _unregister_name(gname)
        if c10d._world.default_pg is self._with_pg(self.all, False).pg:
            c10d._update_default_pg(None)
        self._registered = False

    def abort(self) -> None:
        """Break every group of this generation (``Group.abort``): it lost a rank. Its meshes'
        references go too, so that the communicators are freed (and their connections closed)."""
        self.deactivate()
        for g in self.every_group():
            g.abort()
        for mesh in self._meshes.values():
            registry = getattr(mesh, "_pg_registry", None)
            if registry is not None:
                registry.clear()
        self._meshes.clear()
        gc.collect()

    def interrupt(self, keep_ports: set[int]) -> int:
        """From a thread other than the training one: its collectives blocked on a peer that
        will never answer fail now. NCCL's abort wakes them; gloo's does not, so the process's
        connections are cut (``sever``), all but those to ``keep_ports`` (the job's store). The
        training thread then stalls on the error and ``abort`` follows there. Returns how many
        connections were cut."""
        for g in self.every_group():
            if g.comm is not None:
                g.comm.cut.set()  # (a gloo wait that the cut below does not wake ends within its slice)
            pg = g.pg
            if pg is not None and g.device.type == "cuda":
                try:
                    pg._get_backend(g.device).abort()
                except (RuntimeError, AttributeError):  # already broken, or no abort in this build
                    pass
        return sever(keep_ports)

    def destroy(self) -> None:
        self.deactivate()
        for g in self.every_group():
            g.destroy()

    def __repr__(self) -> str:
        return f"World(gen={self.generation}, rank={self.rank}, {self.layout.describe()})"
