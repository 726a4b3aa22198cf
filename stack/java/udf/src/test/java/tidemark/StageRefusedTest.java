package tidemark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.reflect.Modifier;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

import org.junit.jupiter.api.Test;

/**
 * The refusal's code that crosses to Python: the extract (tidemark.batch.extract.direct) recognises a refused
 * COPY by the exception's class name in the Spark error, held in one constant of include/tidemark,
 * {@code STAGE_REFUSED_CLASS = "..."}. Renaming or moving the class without the constant fails here.
 */
class StageRefusedTest {
    private static final Pattern CONSTANT = Pattern.compile("^STAGE_REFUSED_CLASS = \"([^\"]+)\"$", Pattern.MULTILINE);

    @Test
    void pythonNamesThisClass() throws IOException {
        Path include = Path.of(System.getProperty("tidemark.repo", "../../.."), "include", "tidemark");
        List<String> named = new ArrayList<>();
        try (Stream<Path> files = Files.walk(include)) {
            for (Path py : files.filter(p -> p.toString().endsWith(".py")).toList()) {
                Matcher m = CONSTANT.matcher(Files.readString(py, StandardCharsets.UTF_8));
                while (m.find()) {
                    named.add(m.group(1));
                }
            }
        }
        assertEquals(List.of(StageRefused.class.getName()), named,
                     "exactly one STAGE_REFUSED_CLASS under " + include + ", naming this class");
    }

    @Test
    void aRefusalReadsAsPythonReadsIt() {
        // Spark reports a task's failure by the exception's toString(): "<class>: <message>", on one line
        StageRefused refused = new StageRefused(DirectCopy.REFUSED + " one of 3 rows of batch b attempt 1: why");
        assertEquals("tidemark.StageRefused: the typed stage refused one of 3 rows of batch b attempt 1: why",
                     refused.toString());
        assertTrue(Modifier.isPublic(StageRefused.class.getModifiers()));
        assertTrue(RuntimeException.class.isAssignableFrom(StageRefused.class));
    }
}
