/* A QEMU TCG plugin that counts the guest instructions a program executes
   (benchmarks/neon_instructions.py). Debian ships qemu-user with plugin
   support but without the plugin header, so the few functions it uses are
   declared here as QEMU's include/qemu/qemu-plugin.h (API version 1, QEMU
   7.2) has them. Built with gcc -shared -fPIC; loaded with
   qemu-aarch64 -plugin ./libqemu_insn_count.so -d plugin PROGRAM. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*exec_cb)(unsigned int vcpu_index, void *userdata);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *, exec_cb, enum qemu_plugin_cb_flags, void *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
void qemu_plugin_outs(const char *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t total;   /* all threads' instructions (added atomically) */

/* Each translated block adds its instruction count when it runs. */
static void on_exec(unsigned int vcpu, void *n) {
  (void)vcpu;
  __atomic_fetch_add(&total, (uint64_t)(uintptr_t)n, __ATOMIC_RELAXED);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, QEMU_PLUGIN_CB_NO_REGS,
                                       (void *)(uintptr_t)qemu_plugin_tb_n_insns(tb));
}

static void on_exit(qemu_plugin_id_t id, void *p) {
  (void)id, (void)p;
  char line[64];
  snprintf(line, sizeof line, "instructions %llu\n", (unsigned long long)total);
  qemu_plugin_outs(line);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                                               int argc, char **argv) {
  (void)info, (void)argc, (void)argv;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, on_exit, NULL);
  return 0;
}
