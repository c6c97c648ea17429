/* resume_options.c: see resume_options.h. */
#include "resume_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* An option's value in the snapshot's options JSON, as the command line writes it. */
static void option_value_str(const cJSON *v, char *buf, size_t len) {
    if (!v)
        snprintf(buf, len, "(unset)");
    else if (cJSON_IsBool(v))
        snprintf(buf, len, "%s", cJSON_IsTrue(v) ? "on" : "off");
    else if (cJSON_IsString(v))
        snprintf(buf, len, "%s", v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(buf, len, "%g", v->valuedouble);
    else
        snprintf(buf, len, "?");
}

static int option_values_equal(const cJSON *a, const cJSON *b) {
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    char x[128], y[128];
    option_value_str(a, x, sizeof x);
    option_value_str(b, y, sizeof y);
    return strcmp(x, y) == 0;
}

void resume_report_changed_options(const char *snap_dataset, const char *data_path, const cJSON *was,
                                   const cJSON *now) {
    char line[2048] = "";
    size_t off = 0;
    for (const cJSON *item = now ? now->child : NULL; item && off < sizeof line; item = item->next) {
        if (strcmp(item->string, "epochs") == 0) continue;
        const cJSON *old = was ? cJSON_GetObjectItemCaseSensitive(was, item->string) : NULL;
        if (option_values_equal(old, item)) continue;
        char name[64], a[128], b[128];
        snprintf(name, sizeof name, "--%s", item->string);
        for (char *c = name; *c; c++)
            if (*c == '_') *c = '-';
        option_value_str(old, a, sizeof a);
        option_value_str(item, b, sizeof b);
        off += (size_t)snprintf(line + off, sizeof line - off, "%s%s %s -> %s", off ? ", " : "", name, a, b);
    }
    const char *old_data = snap_dataset ? snap_dataset : "";
    char *data = realpath(data_path, NULL);
    if (old_data[0] && data && strcmp(old_data, data) != 0 && off < sizeof line)
        off += (size_t)snprintf(line + off, sizeof line - off, "%sthe dataset %s -> %s", off ? ", " : "",
                                old_data, data);
    free(data);
    if (off > 0) log_warn_once("resuming with other settings than the snapshot's: %s", line);
}

int resume_order_changed(const cJSON *was, const cJSON *now) {
    static const char *const order_keys[] = {"batch_size", "seed", "val_fraction"};
    int changed = 0;
    for (size_t k = 0; k < sizeof order_keys / sizeof *order_keys && was && now; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(was, order_keys[k]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(now, order_keys[k]);
        if ((a || b) && !option_values_equal(a, b)) changed = 1; /* "val_fraction" only when set */
    }
    return changed;
}
