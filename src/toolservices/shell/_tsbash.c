/* A bash loadable builtin that lets one live bash serve a shell session's commands.
 *
 * Loaded with `enable -f _tsbash.so __ts_serve` by the session's root bash (see
 * _native.py, which starts it and speaks to it). `__ts_serve FD` serves requests on
 * the unix socket FD, each one byte of role, one byte n, n target descriptor
 * numbers, and n descriptors (SCM_RIGHTS). For each it clones this bash with
 * CLONE_PARENT (the copy is the supervisor's child: it alone waits for its exit
 * status, as for any bash it started), answers the copy's pid (8 bytes, or
 * -errno), and waits for the next request. In the copy the descriptors land on
 * their targets, every other one above 2 is closed, and:
 *
 *   role 'm' (a master): the copy is named "bash", evaluates the shell state in
 *     the memfd on fd 5 (in C: no function of the state can stand in for the loop)
 *     and serves on its own socket (fd 3): the live state, cloned per command;
 *   role 'c' (a command): the copy enters a Landlock domain of its own (so no
 *     process of another command can open its descriptors or memory), becomes
 *     dumpable again, reads its command from the memfd on fd 3 into $__ts_cmd, sets
 *     $$ to its own pid and returns 0: the script goes on to run the command;
 *   role 'w' (a copy ahead of need): as 'c', but without a command: the copy
 *     returns 0 so that the script sets its EXIT trap, and then (`__ts_serve wait`)
 *     waits on its own socket (fd 5) for one message 'r' carrying the command's
 *     descriptors (no answer: its pid is known), mapping the code it shares with
 *     its master if none comes at once: the clone and that set-up are off the
 *     command's path.
 *
 * The first call (in the root bash) makes the process non-dumpable, prepares the
 * commands' Landlock ruleset once, and enters a nested Landlock domain scoped for
 * signals (ABI >= 6): commands cannot signal the supervisor, which stays outside.
 * It returns 1 when the socket closes, 4 when a Landlock layer could not be set up.
 *
 * `__ts_serve done STATUS`, the first step of a command's EXIT trap, tells the supervisor
 * on fd 6 (then closed) that the command ended with STATUS and the state is being saved:
 * it answers its caller without waiting for the save (4 bytes, the status; none when bash
 * ends by a signal: then only `waitpid` knows the status, nor when the save is bound to
 * fail). `__ts_serve watch`, run by the root once its EXIT trap is set (every copy
 * inherits both), wraps bash's handler of each fatal signal to note the signal first:
 * without that note a trap run on the way to a signal's death says `$?`.
 *
 * `__ts_serve same`, where the trap would print the state, is true when a fingerprint
 * of the state (what the save prints, read through bash's own functions) equals the
 * one of the state the copy came from (given with its command): the trap then saves
 * only "#ts-same". Else `__ts_serve fp` prints the fingerprint first in the state.
 *
 * `__ts_serve limits` prints the `ulimit` commands that restore the limits a command
 * changed since the root started (the state's part that `ulimit -a` twice, read back
 * and compared, used to give: _terminal.compact_limits).
 *
 * Only a few of bash's exported symbols are used, with their types declared here
 * (stable since bash 4): no bash headers are needed to build it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

typedef struct word_desc { char *word; int flags; } WORD_DESC;
typedef struct word_list { struct word_list *next; WORD_DESC *word; } WORD_LIST;
typedef int sh_builtin_func_t(WORD_LIST *);
struct builtin {
    char *name;
    sh_builtin_func_t *function;
    int flags;
    char *const *long_doc;
    const char *short_doc;
    char *handle;
};
#define BUILTIN_ENABLED 0x01

extern void *bind_variable(const char *, char *, int);
extern void termsig_sighandler(int) __attribute__((weak)); /* bash's fatal-signal handler */

/* What `fingerprint` reads of bash's state: its variables (a layout unchanged since bash 2),
 * functions and aliases, through the functions `declare -p`, `declare -f` and `alias -p`
 * use themselves. Weak: a bash without one of them never skips the save. */
typedef struct variable {
    char *name, *value, *exportstr;
    void *dynamic_value, *assign_func;
    int attributes, context;
} SHELL_VAR;
typedef struct alias { char *name, *value; char flags; } alias_t;
extern SHELL_VAR **all_shell_variables(void) __attribute__((weak));
extern SHELL_VAR **all_shell_functions(void) __attribute__((weak));
extern alias_t **all_aliases(void) __attribute__((weak));
extern char *array_to_assign(void *, int) __attribute__((weak));
extern char *assoc_to_assign(void *, int) __attribute__((weak));
extern char *named_function_string(char *, void *, int) __attribute__((weak));
#define ATT_ARRAY 0x4
#define ATT_ASSOC 0x40
#define ATT_INVISIBLE 0x1000
#define FUNC_TEXT 0x3 /* FUNC_MULTILINE | FUNC_EXTERNAL, as `declare -f` prints */
extern pid_t dollar_dollar_pid;
extern pid_t last_asynchronous_pid;

#define SEVAL_NOHIST 0x004
#define SEVAL_NOFREE 0x008

#define LL_CREATE 444
#define LL_ADD_RULE 445
#define LL_RESTRICT 446
#define LL_VERSION 1
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE 1ULL
#define LL_FS_REFER (1ULL << 13)
#define LL_SCOPE_ALL 3ULL /* abstract unix sockets | signals (ABI 6) */

#define MAX_FDS 8
#define DONE_FD 6 /* a command's copy: where `done` tells that the command ended */
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

struct ll_attr { uint64_t fs, net, scoped; };
struct __attribute__((packed)) ll_beneath { uint64_t allowed; int32_t parent_fd; };

static int initialized;
static int done_fd = -1;               /* DONE_FD moved out of the command's way, close-on-exec */
static volatile sig_atomic_t died_of;  /* a fatal signal bash's handler was given (`watch`) */
static uint64_t expected;              /* the fingerprint of the state this copy came from, or 0 */
static uint64_t measured;              /* this copy's own (`same`), printed by `fp` */

/* A file a descriptor names when the copy takes its command: a command may put something
 * else on the same number (`exec 4>file`), which must then get none of our writes. */
struct file_id { dev_t dev; ino_t ino; int known; };
static struct file_id done_file, state_file;

static struct file_id identify(int fd) {
    struct stat st; /* by the system call: fstat is versioned GLIBC_2.33 (see slurp) */
    struct file_id id = {0, 0, 0};
    if (fd >= 0 && syscall(SYS_newfstatat, fd, "", &st, AT_EMPTY_PATH) == 0)
        id = (struct file_id){st.st_dev, st.st_ino, 1};
    return id;
}

static int still(int fd, struct file_id id) {
    struct file_id now = identify(fd);
    return id.known && now.known && now.dev == id.dev && now.ino == id.ino;
}
static int waiting; /* a copy made ahead of its command ('w'), serving on fd 5 */

/* The limits `ulimit -a` lists (bash's order, without the read-only pipe size): its flag,
 * the resource, the unit it prints in; and their values when the root started. */
static const struct { char flag; int resource; rlim_t unit; } LIMITS[] = {
    {'R', 15, 1}, {'c', RLIMIT_CORE, 1024}, {'d', RLIMIT_DATA, 1024}, {'e', 13, 1},
    {'f', RLIMIT_FSIZE, 1024}, {'i', 11, 1}, {'l', RLIMIT_MEMLOCK, 1024},
    {'m', RLIMIT_RSS, 1024}, {'n', RLIMIT_NOFILE, 1}, {'q', 12, 1}, {'r', 14, 1},
    {'s', RLIMIT_STACK, 1024}, {'t', RLIMIT_CPU, 1}, {'u', RLIMIT_NPROC, 1},
    {'v', RLIMIT_AS, 1024}, {'x', 10, 1},
};
#define NLIMITS (sizeof LIMITS / sizeof LIMITS[0])
#define FSIZE_INDEX 4 /* RLIMIT_FSIZE's row */
static struct rlimit started[NLIMITS];
static int command_ruleset = -1;

/* A ruleset granting `rights` beneath / (the session's own layers decide). */
static int ruleset(uint64_t rights, uint64_t scoped, size_t size) {
    struct ll_attr attr = {rights, 0, scoped};
    int fd = (int)syscall(LL_CREATE, &attr, size, 0);
    if (fd < 0) return -1;
    int root = open("/", O_PATH | O_CLOEXEC);
    struct ll_beneath rule = {rights, root};
    if (root < 0 || syscall(LL_ADD_RULE, fd, LL_RULE_PATH_BENEATH, &rule, 0) != 0) {
        if (root >= 0) close(root);
        close(fd);
        return -1;
    }
    close(root);
    return fd;
}

static void shut(unsigned low, unsigned high);

static int init(int sock) {
    /* Woken by a request, the root, a master or a copy waiting for its command must not
     * preempt the supervisor on its way to reply: they wait in batch policy (no preemption
     * on wake-up); a command's copy takes the normal one back (`take_command`). */
    struct sched_param param = {0};
    sched_setscheduler(0, SCHED_BATCH, &param);
    for (size_t i = 0; i < NLIMITS; i++) getrlimit(LIMITS[i].resource, &started[i]);
    shut(3, (unsigned)sock - 1); /* nothing the supervisor left open stays reachable */
    shut((unsigned)sock + 1, ~0U);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* its /proc/<pid>/fd stays closed to commands */
    prctl(PR_SET_NAME, "ts-shell", 0, 0, 0);
    long abi = syscall(LL_CREATE, NULL, 0, LL_VERSION);
    if (abi >= 1) {
        uint64_t rights = LL_FS_EXECUTE | (abi >= 2 ? LL_FS_REFER : 0);
        int fd = ruleset(rights, 0, sizeof(uint64_t)); /* ABI 1's struct: fs only */
        if (fd < 0) return -1;
        command_ruleset = fcntl(fd, F_DUPFD_CLOEXEC, 100); /* out of the targets' way */
        close(fd);
        if (command_ruleset < 0) return -1;
    }
    if (abi >= 6) {
        int fd = ruleset(LL_FS_REFER, LL_SCOPE_ALL, sizeof(struct ll_attr));
        if (fd < 0) return -1;
        long done = syscall(LL_RESTRICT, fd, 0);
        close(fd);
        if (done != 0) return -1;
    }
    return 0;
}

/* The whole memfd `fd` as a NUL-terminated string (NULL on error). */
static char *slurp(int fd) {
    /* lseek, not fstat: fstat is versioned GLIBC_2.33, and images may carry an older glibc */
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0) return NULL;
    char *text = malloc((size_t)size + 1);
    if (text == NULL) return NULL;
    size_t got = 0;
    while (got < (size_t)size) {
        ssize_t n = pread(fd, text + got, (size_t)size - got, (off_t)got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    text[got] = '\0';
    return text;
}

/* Evaluate `text` at the top level of this bash, as `source` would. */
/* bash's own functions, bound weakly at load (not dlsym: versioned GLIBC_2.34 since libdl
   moved into libc, which older images' glibc cannot resolve). */
extern int evalstring(char *, const char *, int) __attribute__((weak)); /* bash >= 5.1 */
extern int parse_and_execute(char *, const char *, int) __attribute__((weak));

static void evaluate(char *text) {
    int (*run)(char *, const char *, int) = evalstring;
    if (run == NULL) run = parse_and_execute;
    if (run != NULL) run(text, "state", SEVAL_NOHIST | SEVAL_NOFREE);
}

/* Close descriptors low..high (close_range, Linux 5.9; one by one before). */
static void shut(unsigned low, unsigned high) {
    if (low > high) return;
    if (syscall(SYS_close_range, low, high, 0) == 0) return;
    long top = sysconf(_SC_OPEN_MAX);
    for (unsigned fd = low; fd <= high && fd < (unsigned)top && fd < 65536; fd++) close((int)fd);
}

/* Put `fds[i]` on `targets[i]`, close every other descriptor above 2. */
static void place(int *fds, const unsigned char *targets, int n) {
    int moved[MAX_FDS];
    for (int i = 0; i < n; i++) { /* above every target first: no dup2 overwrites a source */
        moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 10); /* within a lowered `ulimit -n` */
        close(fds[i]);
    }
    for (int i = 0; i < n; i++) {
        dup2(moved[i], targets[i]);
        close(moved[i]);
    }
    /* close_range between the descriptors kept (ascending), then above the last */
    int low = 3;
    for (int fd = 3; fd <= 255; fd++) {
        int keep = fd == command_ruleset; /* closed by the command's copy, once used */
        for (int i = 0; i < n; i++) keep |= targets[i] == fd;
        if (!keep) continue;
        if (fd > low) shut(low, fd - 1);
        low = fd + 1;
    }
    if (command_ruleset > 255) {
        shut(low, command_ruleset - 1);
        low = command_ruleset + 1;
    }
    shut(low, ~0U);
}

/* In a command's copy, its descriptors in place: from fd 3 the fingerprint of the state it
 * came from (16 hex digits and a newline) and the command, into $__ts_cmd. */
static int take_command(void) {
    struct sched_param param = {0};
    sched_setscheduler(0, SCHED_OTHER, &param); /* commands run in the normal policy */
    char *text = slurp(3), *command = text;
    close(3);
    if (text != NULL && strlen(text) >= 17 && text[16] == '\n') {
        text[16] = '\0';
        expected = strtoull(text, NULL, 16);
        command = text + 17;
    }
    if (fcntl(DONE_FD, F_GETFD) >= 0) { /* out of reach of the command's `>&6`, not inherited */
        done_fd = fcntl(DONE_FD, F_DUPFD_CLOEXEC, 100);
        close(DONE_FD);
        done_file = identify(done_fd);
    }
    state_file = identify(4);
    bind_variable("__ts_cmd", command != NULL ? command : (char *)"", 0);
    free(text);
    return 0;
}

static int answer(int sock, int64_t value) {
    return send(sock, &value, sizeof value, MSG_NOSIGNAL) == (ssize_t)sizeof value ? 0 : -1;
}

#define MAP_AFTER_MS 2
/* In a copy made ahead of need: map the code it shares with its master (bash's, the C
 * library's...) into its own page tables now, off the command's path; a new process
 * otherwise takes a page fault per few pages of code it runs. */
static void map_code(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL) return;
    char line[512];
    while (fgets(line, sizeof line, maps) != NULL) {
        char *end; /* "lo-hi perms ...": not sscanf, which is versioned GLIBC_2.7 */
        unsigned long lo = strtoul(line, &end, 16), hi;
        if (*end != '-') continue;
        hi = strtoul(end + 1, &end, 16);
        if (*end != ' ' || strlen(end) < 4 || end[3] != 'x') continue;
        madvise((void *)lo, hi - lo, 22 /* MADV_POPULATE_READ, Linux 5.14 */);
    }
    fclose(maps);
}

static int serve(int sock) {
    for (;;) {
        unsigned char head[2 + MAX_FDS];
        char space[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct iovec iov = {head, sizeof head};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space;
        msg.msg_controllen = sizeof space;
        ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 1; /* the supervisor is gone, or wants a new master */
        int fds[MAX_FDS], n = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < count; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (n < MAX_FDS) fds[n++] = fd; else close(fd);
            }
        }
        unsigned char role = got >= 1 ? head[0] : 0;
        int valid = waiting ? role == 'r' : (role == 'c' || role == 'm' || role == 'w');
        if (got < 2 || head[1] != n || got != 2 + n || !valid) {
            for (int i = 0; i < n; i++) close(fds[i]);
            if (answer(sock, -EINVAL) != 0) return 1;
            continue;
        }
        if (role == 'r') { /* a waiting copy's command: no answer, its pid is known */
            place(fds, head + 2, n);
            return take_command();
        }
        pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
        if (pid != 0) {
            int64_t reply = pid > 0 ? (int64_t)pid : -(int64_t)errno;
            for (int i = 0; i < n; i++) close(fds[i]);
            if (answer(sock, reply) != 0) return 1;
            continue;
        }
        setpgid(0, 0);
        dollar_dollar_pid = getpid();
        last_asynchronous_pid = -1;
        if (role == 'm') {
            int state_fd = -1;
            place(fds, head + 2, n);
            for (int i = 0; i < n; i++) if (head[2 + i] == 5) state_fd = 5;
            prctl(PR_SET_NAME, "bash", 0, 0, 0);
            if (state_fd >= 0) {
                char *state = slurp(state_fd);
                close(state_fd);
                if (state != NULL) {
                    evaluate(state);
                    free(state);
                }
            }
            sock = 3;
            continue;
        }
        /* a command's copy, or one waiting for its command: a Landlock domain of its own */
        if (command_ruleset >= 0 && syscall(LL_RESTRICT, command_ruleset, 0) != 0) _exit(126);
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        place(fds, head + 2, n);
        if (command_ruleset >= 0) close(command_ruleset);
        command_ruleset = -1;
        if (role == 'c') return take_command();
        waiting = 1; /* 'w': its socket on fd 5, the command's descriptors to come */
        return 0;
    }
}

#define FATAL_MAX 32 /* the signals bash may handle as fatal: the standard ones */

static void noted(int sig) {
    died_of = sig;
    termsig_sighandler(sig);
}

/* `__ts_serve watch`: each signal bash handles as fatal goes through `noted` first. */
static int watch(void) {
    if (termsig_sighandler == NULL) return 0; /* an unknown bash: `done` never answers early */
    for (int sig = 1; sig < FATAL_MAX; sig++) {
        struct sigaction now;
        if (sigaction(sig, NULL, &now) != 0 || (now.sa_flags & SA_SIGINFO)) continue;
        if (now.sa_handler != termsig_sighandler) continue;
        now.sa_handler = noted;
        sigaction(sig, &now, NULL);
    }
    return 0;
}

/* `__ts_serve done STATUS`: the command ended with STATUS, unless bash is dying of a signal,
 * or a fatal signal reaches bash's handler unwatched (a command set and reset its trap). */
static int done(const char *status) {
    int fd = done_fd, early = termsig_sighandler != NULL && died_of == 0;
    done_fd = -1;
    if (fd < 0 || !still(fd, done_file)) return 0; /* none, or the command's own by now */
    /* a save bound to fail (fd 4 not the state's memfd any more, a lowered file size
     * limit) is not answered early: the command's own result then says `restarted` */
    struct rlimit fsize;
    if (!still(4, state_file) || getrlimit(RLIMIT_FSIZE, &fsize) != 0 ||
        fsize.rlim_cur < started[FSIZE_INDEX].rlim_cur)
        early = 0;
    for (int sig = 1; early && sig < FATAL_MAX; sig++) {
        struct sigaction now;
        if (sigaction(sig, NULL, &now) == 0 && !(now.sa_flags & SA_SIGINFO) &&
            now.sa_handler == termsig_sighandler)
            early = 0;
    }
    if (early) { /* a short or failed write: the supervisor waits for the exit, as without */
        int32_t value = atoi(status) & 0xff;
        ssize_t sent = write(fd, &value, sizeof value);
        (void)sent;
    }
    close(fd);
    return 0;
}

static uint64_t mix(uint64_t hash, const void *data, size_t size) { /* FNV-1a, 64 bits */
    const unsigned char *byte = data;
    for (size_t i = 0; i < size; i++) hash = (hash ^ byte[i]) * 0x100000001b3ULL;
    return hash;
}

static uint64_t mix_text(uint64_t hash, const char *text) { /* with its NUL: unambiguous */
    return text == NULL ? mix(hash, "\1", 2) : mix(hash, text, strlen(text) + 1);
}

/* A fingerprint of everything the EXIT trap saves (variables, functions, aliases, limits),
 * as bash holds it now; 0 if this bash lacks a function it needs. */
static uint64_t fingerprint(void) {
    if (!all_shell_variables || !all_shell_functions || !all_aliases || !array_to_assign ||
        !assoc_to_assign || !named_function_string)
        return 0;
    uint64_t hash = 0xcbf29ce484222325ULL;
    SHELL_VAR **vars = all_shell_variables();
    for (size_t i = 0; vars != NULL && vars[i] != NULL; i++) {
        SHELL_VAR *var = vars[i];
        hash = mix(mix_text(hash, var->name), &var->attributes, sizeof var->attributes);
        if (var->attributes & ATT_INVISIBLE) continue;
        if (var->attributes & (ATT_ARRAY | ATT_ASSOC)) {
            char *text = (var->attributes & ATT_ARRAY) ? array_to_assign(var->value, 0)
                                                       : assoc_to_assign(var->value, 0);
            hash = mix_text(hash, text);
            free(text);
        } else {
            hash = mix_text(hash, var->value);
        }
    }
    free(vars);
    SHELL_VAR **funcs = all_shell_functions();
    for (size_t i = 0; funcs != NULL && funcs[i] != NULL; i++) {
        SHELL_VAR *fn = funcs[i];
        hash = mix(mix_text(hash, fn->name), &fn->attributes, sizeof fn->attributes);
        hash = mix_text(hash, named_function_string(fn->name, fn->value, FUNC_TEXT));
    }
    free(funcs);
    alias_t **aliases = all_aliases();
    for (size_t i = 0; aliases != NULL && aliases[i] != NULL; i++)
        hash = mix_text(mix_text(hash, aliases[i]->name), aliases[i]->value);
    free(aliases);
    for (size_t i = 0; i < NLIMITS; i++) {
        struct rlimit now = {0, 0};
        getrlimit(LIMITS[i].resource, &now);
        hash = mix(hash, &now, sizeof now);
    }
    return hash == 0 ? 1 : hash;
}

/* `__ts_serve same`, in the EXIT trap where the save would print: 0 (true) when this copy's
 * state is the one it came from (nothing to save: the trap writes "#ts-same" instead). */
static int same(void) {
    /* fd 4 is no longer the state's memfd (the command redirected it for good): nothing is
     * saved, rather than the state written into the command's file; the session says
     * `restarted` */
    if (!still(4, state_file)) return 0;
    measured = fingerprint();
    if (measured == 0 || measured != expected) return 1;
    static const char mark[] = "#ts-same\n";
    return pwrite(4, mark, sizeof mark - 1, 0) == (ssize_t)(sizeof mark - 1) ? 0 : 1;
}

/* `__ts_serve limits`: the `ulimit` commands that restore what a command changed (soft
 * values first: they never exceed the hard ones kept), as the state saves them. */
static int print_limits(void) {
    for (int hard = 0; hard < 2; hard++) {
        for (size_t i = 0; i < NLIMITS; i++) {
            struct rlimit now;
            if (getrlimit(LIMITS[i].resource, &now) != 0) continue;
            rlim_t value = hard ? now.rlim_max : now.rlim_cur;
            if (value == (hard ? started[i].rlim_max : started[i].rlim_cur)) continue;
            if (value == RLIM_INFINITY)
                printf("builtin ulimit -%c -%c unlimited 2>/dev/null\n", hard ? 'H' : 'S',
                       LIMITS[i].flag);
            else
                printf("builtin ulimit -%c -%c %llu 2>/dev/null\n", hard ? 'H' : 'S',
                       LIMITS[i].flag, (unsigned long long)(value / LIMITS[i].unit));
        }
    }
    fflush(stdout);
    return 0;
}

static int ts_serve_builtin(WORD_LIST *list) {
    if (list == NULL || list->word == NULL) return 2;
    if (strcmp(list->word->word, "limits") == 0) return print_limits();
    if (strcmp(list->word->word, "watch") == 0) return watch();
    if (strcmp(list->word->word, "wait") == 0) {
        if (!waiting) return 0;
        /* the command not there at once: the caller is away, map the code meanwhile (back
         * to back that would only add work: the mapping and its unmapping at exit) */
        struct pollfd ready = {5, POLLIN, 0};
        if (poll(&ready, 1, MAP_AFTER_MS) == 0) map_code();
        return serve(5);
    }
    if (strcmp(list->word->word, "same") == 0) return same();
    if (strcmp(list->word->word, "fp") == 0) {
        if (measured != 0) printf("#ts-fp %016llx\n", (unsigned long long)measured);
        fflush(stdout);
        return 0;
    }
    if (strcmp(list->word->word, "done") == 0)
        return done(list->next != NULL && list->next->word != NULL ? list->next->word->word : "");
    int sock = atoi(list->word->word);
    if (!initialized) {
        initialized = 1;
        if (init(sock) != 0) return 4;
    }
    return serve(sock);
}

static char *ts_serve_doc[] = {"Serve a shell session's commands (toolservices).", NULL};

struct builtin __ts_serve_struct = {
    "__ts_serve", ts_serve_builtin, BUILTIN_ENABLED, ts_serve_doc, "__ts_serve fd", 0,
};
