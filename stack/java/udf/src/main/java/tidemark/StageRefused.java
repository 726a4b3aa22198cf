package tidemark;

/**
 * A direct extract's COPY refused for its rows themselves (a value its column's binary form cannot
 * carry, or the server's data exception or integrity violation): every new attempt meets the same
 * refusal, so the extract ends with its exit 3 and the refusal's words instead of a retry.
 *
 * The type is the code that crosses to Python: the extract (tidemark.batch.extract.direct) recognises a
 * refusal by this class's name in the Spark error, held in one constant, {@code STAGE_REFUSED_CLASS}
 * in include/tidemark (StageRefusedTest checks that it names this class). The message is for people:
 * the extract's failure line quotes it.
 */
public final class StageRefused extends RuntimeException {
    private static final long serialVersionUID = 1L;

    StageRefused(String message) {
        super(message);
    }
}
