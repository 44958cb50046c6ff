/* dx_log: one-line log records on stderr ("2026-11-29T14:00:00.123Z INFO msg").
 * Thread-safe (one fprintf per record).  Level from --log-level or the
 * DUPLEX_LOG environment variable (error|warn|info|debug). */
#ifndef DX_LOG_H
#define DX_LOG_H

enum dx_log_level { DX_LOG_ERROR = 0, DX_LOG_WARN, DX_LOG_INFO, DX_LOG_DEBUG };

void dx_log_set_level(enum dx_log_level lvl);
/* Parses "error|warn|info|debug"; returns 0 or DX_EINVAL. */
int dx_log_parse_level(const char *s, enum dx_log_level *out);
enum dx_log_level dx_log_get_level(void);
void dx_log(enum dx_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DX_LOGE(...) dx_log(DX_LOG_ERROR, __VA_ARGS__)
#define DX_LOGW(...) dx_log(DX_LOG_WARN, __VA_ARGS__)
#define DX_LOGI(...) dx_log(DX_LOG_INFO, __VA_ARGS__)
#define DX_LOGD(...)                                                                               \
    do {                                                                                           \
        if (dx_log_get_level() >= DX_LOG_DEBUG) dx_log(DX_LOG_DEBUG, __VA_ARGS__);                 \
    } while (0)

#endif
