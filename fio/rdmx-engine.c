/*
 * fio external ioengine over rdmx's block client (rdmx_blk_*, docs/block.md).
 *
 *   fio --ioengine=external:fio/rdmx-engine.so --hostname=127.0.0.1 --port=18600 \
 *       --volume=v0 [--mode=rpc|read] [--profile=NAME] [--set=KEY=VALUE[;KEY=VALUE...]] ...
 *   fio ... --paths=10.0.0.1:18600,10.0.1.1:18600 --volume=v0 ...   (multipath, instead of
 *       hostname/port: rdmx_blk_open_paths, docs/failover.md)
 *
 * One rdmx_blk client (one session, and in mode=read one RC connection) per fio job
 * (numjobs = connections). queue() collects io_us, commit() submits them as one batch,
 * getevents() polls the client (caller-driven: all progress on the job's thread), event()
 * hands them back. A request the target fails, or every request in flight when the
 * target dies, completes with its errno (EIO for a dead target) at once. With paths=, the
 * IO in flight on a path that fails is re-issued on another and completes without error
 * (EIO only when no path answered for io_fail_timeout_ms); the path counters are logged
 * when the job ends ("rdmx: path ...").
 *
 * Built against the configured source tree of the installed fio (fio/fio-src.sh), with
 * -include config-host.h, so that FIO_IOOPS_VERSION and every struct layout are the
 * installed fio's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#include <rdmx.h>

struct rdmx_fio_options {
	void *pad; /* fio: an option's offset must not be 0 */
	char *hostname;
	unsigned int port;
	char *paths;
	char *volume;
	char *mode;
	char *profile;
	char *set;
	char *keyring;
	char *entity;
};

struct rdmx_fio_data {
	rdmx_blk *blk;
	/* queued, not yet accepted by the client */
	struct io_u **queued;
	unsigned int nqueued;
	/* completed, handed out by event() */
	struct io_u **events;
	unsigned int nevents;
	/* failed locally (the target is gone) in commit(): handed out by the next getevents() */
	struct io_u **failed;
	unsigned int nfailed;
	rdmx_blk_req *reqs;
	rdmx_blk_completion *wc;
	unsigned int depth;
	/* fio's IO buffer area was registered (rdmx_blk_mem_register) */
	int pinned;
};

/* Registers fio's IO buffer area once, so that no request registers memory. fio allocates
 * it after the engine's init(), so this runs on the first submission. Without it, fio's
 * 4 KiB buffers (page-aligned only with direct=1) share pages with their neighbours, and
 * registering one retired its neighbour's registration in the cache: mlock + munlock on 3
 * reads in 4 (measured with perf, 73.5K IOPS with 54,785 mlock calls in 2 s). */
static void pin_buffers(struct thread_data *td, struct rdmx_fio_data *d)
{
	if (d->pinned || !td->orig_buffer || !td->orig_buffer_size)
		return;
	d->pinned = 1;
	if (rdmx_blk_mem_register(d->blk, td->orig_buffer, td->orig_buffer_size) != RDMX_OK)
		log_info("fio: rdmx: IO buffers not pre-registered (%s): registering per buffer\n",
			 rdmx_last_error());
}

static struct fio_option options[] = {
	{
		.name = "hostname",
		.lname = "rdmx target host",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, hostname),
		.help = "Address of the rdmx-target",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "port",
		.lname = "rdmx target port",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct rdmx_fio_options, port),
		.minval = 1,
		.maxval = 65535,
		.help = "Port of the rdmx-target (--listen)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "paths",
		.lname = "rdmx target paths",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, paths),
		.help = "Multipath: ADDR:PORT,ADDR:PORT[,...] of targets exporting the same volume (instead of hostname/port)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "volume",
		.lname = "rdmx volume",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, volume),
		.help = "Name of the volume on the target (--volume NAME=...)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "mode",
		.lname = "rdmx IO mode",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, mode),
		.def = "rpc",
		.help = "rpc: every IO through the target; read: one-sided RDMA READ/WRITE of a memory volume",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "profile",
		.lname = "rdmx profile",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, profile),
		.help = "rdmx configuration profile (e.g. ceph-after)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "set",
		.lname = "rdmx knobs",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, set),
		.help = "rdmx configuration keys, KEY=VALUE[;KEY=VALUE...] (as rdmx-perf --set)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "keyring",
		.lname = "rdmx keyring",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, keyring),
		.help = "Ceph-style keyring file ([client.NAME] key = BASE64, mode 600): authenticate to the target (auth_keyring)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "entity",
		.lname = "rdmx entity",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rdmx_fio_options, entity),
		.help = "Entity whose key from keyring= this client proves, e.g. client.fio (auth_entity)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* Builds the rdmx configuration from profile= and set=; logs and returns NULL on error. */
static rdmx_config *make_config(const struct rdmx_fio_options *o)
{
	rdmx_config *cfg = NULL;
	if (rdmx_config_new(&cfg) != RDMX_OK) {
		log_err("fio: rdmx: config: %s\n", rdmx_last_error());
		return NULL;
	}
	if (o->profile && *o->profile && rdmx_config_set(cfg, "profile", o->profile) != RDMX_OK) {
		log_err("fio: rdmx: profile=%s: %s\n", o->profile, rdmx_last_error());
		goto fail;
	}
	if (o->keyring && *o->keyring &&
	    rdmx_config_set(cfg, "auth_keyring", o->keyring) != RDMX_OK) {
		log_err("fio: rdmx: keyring=%s: %s\n", o->keyring, rdmx_last_error());
		goto fail;
	}
	if (o->entity && *o->entity && rdmx_config_set(cfg, "auth_entity", o->entity) != RDMX_OK) {
		log_err("fio: rdmx: entity=%s: %s\n", o->entity, rdmx_last_error());
		goto fail;
	}
	if (o->set && *o->set) {
		char *s = strdup(o->set), *save = NULL;
		if (!s)
			goto fail;
		for (char *kv = strtok_r(s, "; ", &save); kv; kv = strtok_r(NULL, "; ", &save)) {
			char *eq = strchr(kv, '=');
			if (!eq) {
				log_err("fio: rdmx: set=%s: '%s' is not KEY=VALUE\n", o->set, kv);
				free(s);
				goto fail;
			}
			*eq = '\0';
			if (rdmx_config_set(cfg, kv, eq + 1) != RDMX_OK) {
				log_err("fio: rdmx: set %s=%s: %s\n", kv, eq + 1, rdmx_last_error());
				free(s);
				goto fail;
			}
		}
		free(s);
	}
	if (rdmx_config_validate(cfg) != RDMX_OK) {
		log_err("fio: rdmx: configuration: %s\n", rdmx_last_error());
		goto fail;
	}
	return cfg;
fail:
	rdmx_config_free(cfg);
	return NULL;
}

static int parse_mode(const struct rdmx_fio_options *o, uint32_t *mode)
{
	if (!o->mode || !strcmp(o->mode, "rpc")) {
		*mode = RDMX_BLK_MODE_RPC;
		return 0;
	}
	if (!strcmp(o->mode, "read")) {
		*mode = RDMX_BLK_MODE_READ;
		return 0;
	}
	log_err("fio: rdmx: mode=%s: expected rpc or read\n", o->mode);
	return 1;
}

/* Opens a client over the paths= list (comma-separated ADDR:PORT); NULL (logged) on failure. */
static rdmx_blk *open_paths(const struct rdmx_fio_options *o, uint32_t mode, rdmx_config *cfg)
{
	const char *list[16];
	size_t n = 0;
	char *s = strdup(o->paths), *save = NULL;
	if (!s)
		return NULL;
	for (char *a = strtok_r(s, ", ", &save); a; a = strtok_r(NULL, ", ", &save)) {
		if (n == sizeof(list) / sizeof(list[0])) {
			log_err("fio: rdmx: paths=%s: at most 16 paths\n", o->paths);
			free(s);
			return NULL;
		}
		list[n++] = a;
	}
	rdmx_blk *b = NULL;
	if (rdmx_blk_open_paths(cfg, list, n, o->volume, mode, 10000, &b) != RDMX_OK) {
		log_err("fio: rdmx: open %s over paths=%s: %s\n", o->volume, o->paths,
			rdmx_last_error());
		b = NULL;
	}
	free(s);
	return b;
}

/* Opens a client on the target the options name; NULL (logged) on failure. */
static rdmx_blk *open_client(struct thread_data *td)
{
	struct rdmx_fio_options *o = td->eo;
	uint32_t mode;
	char addr[300];

	if (!o->volume || (!(o->paths && *o->paths) && (!o->hostname || !o->port))) {
		log_err("fio: rdmx: volume= and either paths= or hostname= and port= are required\n");
		return NULL;
	}
	if (parse_mode(o, &mode))
		return NULL;
	rdmx_config *cfg = make_config(o);
	if (!cfg)
		return NULL;
	rdmx_blk *b = NULL;
	if (o->paths && *o->paths) {
		b = open_paths(o, mode, cfg);
		rdmx_config_free(cfg);
		return b;
	}
	if (strchr(o->hostname, ':'))
		snprintf(addr, sizeof(addr), "[%s]:%u", o->hostname, o->port);
	else
		snprintf(addr, sizeof(addr), "%s:%u", o->hostname, o->port);
	if (rdmx_blk_open(cfg, addr, o->volume, mode, 10000, &b) != RDMX_OK) {
		log_err("fio: rdmx: open %s on %s: %s\n", o->volume, addr, rdmx_last_error());
		b = NULL;
	}
	rdmx_config_free(cfg);
	return b;
}

/* Logs each path's state and counters (multipath clients), one line per path, for the
 * failover harness (fio/failover.sh) and for anyone reading the job's output. */
static void log_paths(rdmx_blk *b)
{
	size_t n = rdmx_blk_path_count(b);
	rdmx_blk_counters k = {.struct_size = sizeof(k)};
	if (!n || rdmx_blk_get_counters(b, &k) != RDMX_OK)
		return;
	log_info("rdmx: paths %zu reissued %llu held_writes %llu io_timeouts %llu\n", n,
		 (unsigned long long)k.reissued, (unsigned long long)k.held_writes,
		 (unsigned long long)k.io_timeouts);
	for (size_t i = 0; i < n; i++) {
		rdmx_blk_path p = {.struct_size = sizeof(p)};
		if (rdmx_blk_get_path(b, i, &p) != RDMX_OK)
			continue;
		log_info("rdmx: path %zu state %s active %u issued %llu reissued %llu failed_over %llu "
			 "failures %llu rejoins %llu detect_us %llu\n",
			 i, p.state == RDMX_BLK_PATH_UP ? "up" : p.state == RDMX_BLK_PATH_DOWN ? "down" : "connecting",
			 p.active, (unsigned long long)p.issued, (unsigned long long)p.reissued,
			 (unsigned long long)p.failed_over, (unsigned long long)p.failures,
			 (unsigned long long)p.rejoins, (unsigned long long)p.last_detect_us);
	}
	/* A job process ends without flushing stdio: flush, or the lines are lost. */
	log_info_flush();
}

/* Runs once before the jobs start: the volume's size for fio's file. */
static int rdmx_fio_setup(struct thread_data *td)
{
	if (!td->files_index) {
		add_file(td, td->o.filename ? td->o.filename : "rdmx", 0, 0);
		td->o.nr_files = td->o.nr_files ? : 1;
		td->o.open_files++;
	}
	rdmx_blk *b = open_client(td);
	if (!b)
		return 1;
	rdmx_blk_volume v;
	if (rdmx_blk_info(b, &v) != RDMX_OK) {
		log_err("fio: rdmx: info: %s\n", rdmx_last_error());
		rdmx_blk_free(b);
		return 1;
	}
	rdmx_blk_free(b);
	for (unsigned int i = 0; i < td->files_index; i++) {
		struct fio_file *f = td->files[i];
		f->real_file_size = v.size;
		fio_file_set_size_known(f);
	}
	return 0;
}

static void rdmx_fio_cleanup(struct thread_data *td)
{
	struct rdmx_fio_data *d = td->io_ops_data;
	if (!d)
		return;
	if (d->blk)
		log_paths(d->blk);
	rdmx_blk_free(d->blk);
	free(d->queued);
	free(d->events);
	free(d->failed);
	free(d->reqs);
	free(d->wc);
	free(d);
	td->io_ops_data = NULL;
}

/* Runs in the job's thread or process: its own connection. */
static int rdmx_fio_init(struct thread_data *td)
{
	struct rdmx_fio_data *d = calloc(1, sizeof(*d));
	if (!d)
		return 1;
	td->io_ops_data = d;
	d->depth = td->o.iodepth ? td->o.iodepth : 1;
	d->queued = calloc(d->depth, sizeof(*d->queued));
	d->events = calloc(d->depth, sizeof(*d->events));
	d->failed = calloc(d->depth, sizeof(*d->failed));
	d->reqs = calloc(d->depth, sizeof(*d->reqs));
	d->wc = calloc(d->depth, sizeof(*d->wc));
	if (!d->queued || !d->events || !d->failed || !d->reqs || !d->wc)
		return 1;
	d->blk = open_client(td);
	if (!d->blk)
		return 1;
	pin_buffers(td, d);
	return 0;
}

static enum fio_q_status rdmx_fio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct rdmx_fio_data *d = td->io_ops_data;
	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
	case DDIR_WRITE:
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		break;
	default:
		io_u->error = EOPNOTSUPP;
		return FIO_Q_COMPLETED;
	}
	if (d->nqueued >= d->depth)
		return FIO_Q_BUSY;
	io_u->error = 0;
	d->queued[d->nqueued++] = io_u;
	return FIO_Q_QUEUED;
}

/* Completes an io_u with `err` without the target (refused locally); the next
 * getevents() hands it out. */
static void complete_local(struct rdmx_fio_data *d, struct io_u *io_u, int err)
{
	io_u->error = err;
	io_u->resid = io_u->xfer_buflen;
	d->failed[d->nfailed++] = io_u;
}

/* Submits what is queued; what the client did not take stays queued. */
static int submit_queued(struct thread_data *td)
{
	struct rdmx_fio_data *d = td->io_ops_data;
	if (!d->nqueued)
		return 0;
	pin_buffers(td, d);
	for (unsigned int i = 0; i < d->nqueued; i++) {
		struct io_u *u = d->queued[i];
		rdmx_blk_req *r = &d->reqs[i];
		r->op = u->ddir == DDIR_READ ? RDMX_BLK_READ
			: u->ddir == DDIR_WRITE ? RDMX_BLK_WRITE : RDMX_BLK_FLUSH;
		r->len = (uint32_t)u->xfer_buflen;
		r->offset = u->offset;
		r->buf = u->xfer_buf;
		r->cookie = (uint64_t)(uintptr_t)u;
	}
	size_t k = 0;
	rdmx_status st = rdmx_blk_submit(d->blk, d->reqs, d->nqueued, &k);
	if (st != RDMX_OK) {
		/* The target is gone: fail what waits, so that fio sees the error now. */
		log_err("fio: rdmx: submit: %s\n", rdmx_last_error());
		for (unsigned int i = 0; i < d->nqueued; i++)
			complete_local(d, d->queued[i], st == RDMX_CLOSED ? EIO : EINVAL);
		d->nqueued = 0;
		return 0;
	}
	if (k)
		io_u_mark_submit(td, (unsigned int)k);
	memmove(d->queued, d->queued + k, (d->nqueued - k) * sizeof(*d->queued));
	d->nqueued -= (unsigned int)k;
	return 0;
}

static int rdmx_fio_commit(struct thread_data *td)
{
	return submit_queued(td);
}

static int rdmx_fio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			      const struct timespec *t)
{
	struct rdmx_fio_data *d = td->io_ops_data;
	int32_t timeout_ms = t ? (int32_t)(t->tv_sec * 1000 + t->tv_nsec / 1000000) : -1;
	d->nevents = 0;
	if (max > d->depth)
		max = d->depth;
	for (;;) {
		submit_queued(td);
		/* what failed locally first */
		unsigned int k = d->nfailed < max - d->nevents ? d->nfailed : max - d->nevents;
		memcpy(d->events + d->nevents, d->failed, k * sizeof(*d->failed));
		d->nevents += k;
		memmove(d->failed, d->failed + k, (d->nfailed - k) * sizeof(*d->failed));
		d->nfailed -= k;
		if (d->nevents >= max || (d->nevents >= min && d->nevents > 0))
			break;
		size_t n = 0, want = max - d->nevents;
		size_t need = min > d->nevents ? min - d->nevents : 0;
		if (rdmx_blk_poll(d->blk, d->wc, want, need, need ? timeout_ms : 0, &n) != RDMX_OK) {
			log_err("fio: rdmx: poll: %s\n", rdmx_last_error());
			return -EIO;
		}
		for (size_t i = 0; i < n; i++) {
			struct io_u *u = (struct io_u *)(uintptr_t)d->wc[i].cookie;
			u->error = d->wc[i].status < 0 ? -d->wc[i].status : 0;
			u->resid = u->xfer_buflen - (u->error ? 0 : d->wc[i].len);
			d->events[d->nevents++] = u;
		}
		if (d->nevents >= min || (need && n < need))
			break; /* enough, or the wait timed out */
	}
	return (int)d->nevents;
}

static struct io_u *rdmx_fio_event(struct thread_data *td, int event)
{
	struct rdmx_fio_data *d = td->io_ops_data;
	return d->events[event];
}

static int rdmx_fio_open_file(struct thread_data *td, struct fio_file *f)
{
	(void)td;
	(void)f;
	return 0;
}

static int rdmx_fio_close_file(struct thread_data *td, struct fio_file *f)
{
	(void)td;
	(void)f;
	return 0;
}

struct ioengine_ops ioengine = {
	.name = "rdmx",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.setup = rdmx_fio_setup,
	.init = rdmx_fio_init,
	.cleanup = rdmx_fio_cleanup,
	.queue = rdmx_fio_queue,
	.commit = rdmx_fio_commit,
	.getevents = rdmx_fio_getevents,
	.event = rdmx_fio_event,
	.open_file = rdmx_fio_open_file,
	.close_file = rdmx_fio_close_file,
	.options = options,
	.option_struct_size = sizeof(struct rdmx_fio_options),
};
